"""FlashAttention-3-compatible functions (the ``flash_attn_interface`` module of FlashAttention's hopper/
build) on top of attn_ops, on CPU as well as CUDA (docs/flash_attn_compat.md)::

    from attn_ops.flash_attn3_interface import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

The functions take FlashAttention 3's arguments in its order with its defaults (``softmax_scale`` third after
q, k, v: FA3 has no ``dropout_p``) and return what it returns. Beyond FA3: keyword-only ``out=`` on
``flash_attn_func`` / ``flash_attn_varlen_func`` / ``flash_attn_with_kvcache`` (as vLLM's build takes it) and
``page_table=`` on ``flash_attn_varlen_func`` (packed queries over a paged cache, vLLM's ``block_table``).
``deterministic`` is attn_ops.attention's (the backward in a fixed summation order) and ``flash_attn_with_kvcache``'s
``num_splits`` attn_ops.attention_with_kvcache's (1: no key splits); ``pack_gqa``, ``sm_margin``,
``scheduler_metadata`` and the other functions' ``num_splits`` tune FA3's kernels and are accepted (results do not
depend on them). Raised as ``NotImplementedError`` naming the argument: fp8
descales (``q_descale`` / ``k_descale`` / ``v_descale``). ``attention_chunk`` is chunked-local attention (as
attn_ops.attention's), and keyword-only ``learnable_sink=`` (FlashAttention 4's name) or ``s_aux=`` (vLLM's)
give attention sinks [Hq] (attn_ops.attention's ``sinks``, differentiable). ``qv`` (FA3's second
query, against v: scores ``q . k + qv . v``, MLA's absorbed attention) is taken by every function, any head dims
(q's + qv's at most 1024), with FA3's default scale ``(D + Dv) ** -0.5``; the keys [k ; v] are a view where
k and v sit side by side in one buffer (either order), else a copy per call.
"""

from typing import Optional, Union

import torch
from torch import Tensor

from . import ops
from ._flash_attn_kvcache import FP8, kvcache_step, last_dim_contiguous, sink_logits, with_qv
from .parallel.merge import merge_attention_partials

__all__ = [
    "flash_attn_combine",
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "get_scheduler_metadata",
]

_NAME = "attn_ops.flash_attn3_interface"


def _check_supported(q: Tensor, q_descale=None, k_descale=None, v_descale=None) -> None:
    for name, value in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if value is not None:
            raise NotImplementedError(f"{_NAME}: {name} (fp8 descaling) is not supported")
    if q.dtype in FP8:
        raise NotImplementedError(f"{_NAME}: fp8 inputs are not supported, got {q.dtype}")


def _into(out: Optional[Tensor], result: Tensor) -> Tensor:
    """``result``, written into ``out`` when given (FA3's / vLLM's preallocated output)."""
    if out is None:
        return result
    if out.shape != result.shape or out.dtype != result.dtype or out.device != result.device:
        raise ValueError(f"{_NAME}: out must have shape {list(result.shape)}, dtype {result.dtype} and device "
                         f"{result.device}, got {list(out.shape)}, {out.dtype}, {out.device}")
    return out.copy_(result)


def _attention(q, k, v, softmax_scale, causal, window_size, softcap, attention_chunk, deterministic, qv=None,
               sinks=None, **varlen):
    q, k, v, qv = (last_dim_contiguous(t) for t in (q, k, v, qv))
    q, k = with_qv(q, qv, k, v)
    return ops.attention(q, k, v, scale=softmax_scale, causal=causal, window_left=window_size[0],
                         window_right=window_size[1], softcap=softcap, sinks=sinks, attention_chunk=attention_chunk,
                         deterministic=deterministic, **varlen)


def flash_attn_qkvpacked_func(qkv, softmax_scale=None, causal=False, q_descale=None, k_descale=None, v_descale=None,
                              window_size=(-1, -1), attention_chunk=0, softcap=0.0, deterministic=False,
                              num_heads_q=None, sm_margin=0, return_attn_probs=False):
    """qkv [B, T, 3, H, D], or [B, T, Hq + 2 Hk, D] with ``num_heads_q`` = Hq (GQA) -> out [B, T, Hq, D];
    with return_attn_probs, (out, softmax_lse [B, Hq, T])."""
    _check_supported(qkv, q_descale, k_descale, v_descale)
    if qkv.dim() == 5:
        q, k, v = qkv.unbind(dim=-3)
    else:
        if num_heads_q is None:
            raise ValueError(f"{_NAME}.flash_attn_qkvpacked_func: a 4-D qkv [B, T, Hq + 2 Hk, D] needs num_heads_q")
        num_heads_k = (qkv.shape[2] - num_heads_q) // 2
        if num_heads_q + 2 * num_heads_k != qkv.shape[2]:
            raise ValueError(f"{_NAME}.flash_attn_qkvpacked_func: qkv has {qkv.shape[2]} heads, not num_heads_q = "
                             f"{num_heads_q} plus twice a number of key heads")
        q, k, v = qkv.split([num_heads_q, num_heads_k, num_heads_k], dim=-2)
    out, lse = _attention(q, k, v, softmax_scale, causal, window_size, softcap, attention_chunk, deterministic)
    return (out, lse) if return_attn_probs else out


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
                    v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1, pack_gqa=None,
                    deterministic=False, sm_margin=0, return_attn_probs=False, *, out=None, learnable_sink=None,
                    s_aux=None):
    """q [B, Tq, Hq, D], k [B, Tk, Hk, D], v [B, Tk, Hk, Dv] -> out [B, Tq, Hq, Dv] (differentiable); with
    return_attn_probs, (out, softmax_lse [B, Hq, Tq])."""
    _check_supported(q, q_descale, k_descale, v_descale)
    sinks = sink_logits(s_aux, learnable_sink, f"{_NAME}.flash_attn_func")
    result, lse = _attention(q, k, v, softmax_scale, causal, window_size, softcap, attention_chunk, deterministic, qv,
                             sinks)
    result = _into(out, result)
    return (result, lse) if return_attn_probs else result


def _packed(x: Tensor, cu: Optional[Tensor]):
    """A batched [B, T, ...] tensor as packed [B * T, ...] with its cu_seqlens; a packed one as is."""
    if cu is not None:
        return x, cu
    batch, seqlen = x.shape[:2]
    return x.flatten(0, 1), torch.arange(batch + 1, dtype=torch.int32, device=x.device) * seqlen


def _cu_of_runs(cu: Tensor, runs: Tensor) -> Tensor:
    """cu_seqlens of consecutive runs [B, n] (lengths) starting where ``cu`` starts."""
    return torch.cat([cu[:1], cu[:1] + runs.flatten().cumsum(0)]).to(torch.int32)


def _used_runs(cu_q: Tensor, cu_k: Tensor, seqused_q: Optional[Tensor], seqused_k: Optional[Tensor]):
    """cu_seqlens of three sequences per batch row b: (the used queries, the used keys), (the unused queries,
    no key), (no query, the unused keys). Unused query rows then see no key: zeros, lse -inf."""
    len_q, len_k = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]
    used_q = len_q if seqused_q is None else seqused_q.to(cu_q.dtype)
    used_k = len_k if seqused_k is None else seqused_k.to(cu_k.dtype)
    zeros = torch.zeros_like(len_q)
    return (_cu_of_runs(cu_q, torch.stack([used_q, len_q - used_q, zeros], 1)),
            _cu_of_runs(cu_k, torch.stack([used_k, zeros, len_k - used_k], 1)))


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=None,
                           seqused_k=None, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
                           v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                           pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False, *,
                           page_table=None, out=None, learnable_sink=None, s_aux=None):
    """Packed q [total_q, Hq, D] (or batched [B, Tq, Hq, D] with cu_seqlens_q None) and k / v [total_k, Hk, D]
    (or batched) with int32 cu_seqlens [B + 1] -> out like q with Dv; lse [Hq, total_q] ([B, Hq, Tq] batched).

    ``seqused_q`` / ``seqused_k`` (int32 [B]): sequence b uses only its first seqused_q[b] queries and
    seqused_k[b] keys (causal and windows align on those); unused query rows give zeros. With ``page_table``
    (int32 [B, max_blocks]; an attn_ops extension, keyword only), k / v are paged caches
    [num_blocks, page_size, Hk, D] and sequence b's keys are its first seqused_k[b] cache entries (inference).
    """
    _check_supported(q, q_descale, k_descale, v_descale)
    sinks = sink_logits(s_aux, learnable_sink, f"{_NAME}.flash_attn_varlen_func")
    batched_q = cu_seqlens_q is None
    if batched_q:
        batch, max_seqlen_q = q.shape[:2]
    q, cu_q = _packed(q, cu_seqlens_q)
    qv = None if qv is None else _packed(qv, cu_seqlens_q)[0]
    if page_table is not None:
        if seqused_k is None:
            raise ValueError(f"{_NAME}.flash_attn_varlen_func: page_table needs seqused_k (the keys of each "
                             f"sequence)")
        # two sequences per row: the used queries over the cache row, the unused ones over no key
        len_q = cu_q[1:] - cu_q[:-1]
        used_q = len_q if seqused_q is None else seqused_q.to(len_q.dtype)
        cu_q2 = _cu_of_runs(cu_q, torch.stack([used_q, len_q - used_q], 1))
        lens = torch.stack([seqused_k.to(torch.int32), torch.zeros_like(seqused_k, dtype=torch.int32)], 1).flatten()
        rows = torch.arange(page_table.shape[0], dtype=torch.int32, device=q.device).repeat_interleave(2)
        queries, keys = with_qv(last_dim_contiguous(q), last_dim_contiguous(qv), k, v)
        result, lse = ops.attention_with_kvcache(
            queries, keys, v, lens, block_table=page_table, scale=softmax_scale, causal=causal,
            window_left=window_size[0], window_right=window_size[1], softcap=softcap, cu_seqlens_q=cu_q2,
            max_seqlen_q=max_seqlen_q, cache_batch_idx=rows, sinks=sinks, attention_chunk=attention_chunk)
    else:
        if cu_seqlens_k is None:
            max_seqlen_k = k.shape[1]
        k, cu_k = _packed(k, cu_seqlens_k)
        v, _ = _packed(v, cu_seqlens_k)
        if seqused_q is not None or seqused_k is not None:
            cu_q, cu_k = _used_runs(cu_q, cu_k, seqused_q, seqused_k)
        result, lse = _attention(q, k, v, softmax_scale, causal, window_size, softcap, attention_chunk, deterministic,
                                 qv, sinks, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_seqlen_q,
                                 max_seqlen_k=max_seqlen_k)
    if batched_q:
        result = result.unflatten(0, (batch, -1))
        lse = lse.unflatten(1, (batch, -1)).transpose(0, 1)
    result = _into(out, result)
    return (result, lse) if return_attn_probs else result


def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """Merges split-KV partial results: out_partial [num_splits, B, T, H, Dv] with lse_partial
    [num_splits, B, T, H] -> (out [B, T, H, Dv] in out_dtype (default out_partial's dtype), written into ``out``
    when given; softmax_lse [B, T, H], a transposed view of [B, H, T] as FA3 returns it)."""
    if out_partial.dim() != 5 or lse_partial.shape != out_partial.shape[:-1]:
        raise ValueError(f"{_NAME}.flash_attn_combine: out_partial must be [num_splits, batch, seqlen, heads, "
                         f"head_dim] and lse_partial [num_splits, batch, seqlen, heads], got "
                         f"{list(out_partial.shape)} and {list(lse_partial.shape)}")
    merged, lse = merge_attention_partials(out_partial.unbind(0), lse_partial.transpose(-1, -2).unbind(0))
    merged = merged.to(out_dtype or out_partial.dtype)
    return _into(out, merged), lse.transpose(1, 2)


def flash_attn_with_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Optional[Tensor] = None,
    v: Optional[Tensor] = None,
    qv: Optional[Tensor] = None,
    rotary_cos: Optional[Tensor] = None,
    rotary_sin: Optional[Tensor] = None,
    cache_seqlens: Optional[Union[int, Tensor]] = None,
    cache_batch_idx: Optional[Tensor] = None,
    cache_leftpad: Optional[Tensor] = None,
    page_table: Optional[Tensor] = None,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_k_new: Optional[Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    rotary_seqlens: Optional[Tensor] = None,
    q_descale: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    rotary_interleaved=True,
    scheduler_metadata=None,
    num_splits=0,
    pack_gqa=None,
    sm_margin=0,
    return_softmax_lse=False,
    *,
    out=None,
    learnable_sink=None,
    s_aux=None,
):
    """FlashAttention 3's decode / chunked-prefill entry point: FA2's (attn_ops.flash_attn_interface) plus
    packed queries (``cu_seqlens_q`` [B + 1], ``max_seqlen_q``; q [total_q, Hq, D]), packed new keys
    (``cu_seqlens_k_new``; k / v [total_new, Hk, D]), ``rotary_seqlens`` (int32 [B]: the rotary position of
    each row's first new token, default cache_seqlens) and ``page_table`` (FA2's block_table).

    Returns out, or with return_softmax_lse (out, softmax_lse, out_accum, softmax_lse_accum) as FA3 does; the
    last two are FA3's split-KV scratch results, empty tensors here (the attention is never split into
    partials that the caller must combine).
    """
    _check_supported(q, q_descale, k_descale, v_descale)
    sinks = sink_logits(s_aux, learnable_sink, f"{_NAME}.flash_attn_with_kvcache")
    capacity = k_cache.shape[1] if page_table is None else page_table.shape[1] * k_cache.shape[1]
    seqlen_q = max_seqlen_q if cu_seqlens_q is not None else q.shape[1]
    # FlashAttention 3 drops a window side that spans everything (left >= seqlen_k - 1, right >= seqlen_q - 1);
    # queries then rotate at consecutive positions when causal or windowed, else all at the row's start.
    windowed = (0 <= window_size[0] < capacity - 1) or (seqlen_q is not None and 0 <= window_size[1] < seqlen_q - 1)
    result, lse = kvcache_step(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                               cache_leftpad, page_table, softmax_scale, causal, window_size, softcap,
                               rotary_interleaved, rotate_q_consecutive=causal or windowed,
                               cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                               cu_seqlens_k_new=cu_seqlens_k_new, rotary_seqlens=rotary_seqlens, qv=qv, sinks=sinks,
                               attention_chunk=attention_chunk, num_splits=num_splits)
    result = _into(out, result)
    if not return_softmax_lse:
        return result
    return result, lse, result.new_empty(0, dtype=torch.float32), lse.new_empty(0)


def get_scheduler_metadata(batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim,
                           cache_seqlens: Tensor, qkv_dtype=torch.bfloat16, headdim_v=None,
                           cu_seqlens_q: Optional[Tensor] = None, cu_seqlens_k_new: Optional[Tensor] = None,
                           cache_leftpad: Optional[Tensor] = None, page_size: Optional[int] = None,
                           max_seqlen_k_new=0, causal=False, window_size=(-1, -1), attention_chunk=0,
                           has_softcap=False, num_splits=0, pack_gqa=None, sm_margin=0):
    """FA3 plans its split-KV schedule ahead here; attn_ops needs no plan, so this returns an empty int32 tensor
    on cache_seqlens' device, which ``flash_attn_with_kvcache(..., scheduler_metadata=)`` accepts."""
    return torch.empty(0, dtype=torch.int32, device=cache_seqlens.device)
