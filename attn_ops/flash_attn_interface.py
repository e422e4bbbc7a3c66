"""FlashAttention-2-compatible functions on top of attn_ops (docs/flash_attn_compat.md).

Code written for ``flash_attn`` runs unchanged after one import change, on CPU as well as CUDA::

    from attn_ops.flash_attn_interface import flash_attn_func, flash_attn_with_kvcache

Each function takes FlashAttention 2's arguments with its semantics and is a thin mapping onto
``attn_ops`` ops (no Python loops over the batch, no host synchronization), so it compiles with
``torch.compile(fullgraph=True)``. ``alibi_slopes`` (float32 [Hq] or [B, Hq]) is attn_ops.attention's ALiBi,
FlashAttention 2's definition. Not supported (a clear ``NotImplementedError``): ``dropout_p > 0``, fp8 inputs.
``deterministic`` is attn_ops.attention's (the backward in a fixed summation order) and ``num_splits``
attn_ops.attention_with_kvcache's (1: no key splits, a row's result independent of the batch). With
``return_attn_probs=True`` the functions return ``(out, softmax_lse, None)``: the lse as FlashAttention gives
it, no attention probabilities (those only exist for dropout in FlashAttention too). ``flash_attn_func``,
``flash_attn_varlen_func`` and ``flash_attn_with_kvcache`` also take keyword-only attention sinks [Hq] as
``s_aux=`` (vLLM's name) or ``learnable_sink=`` (FlashAttention 4's): attn_ops.attention's ``sinks``.
FlashAttention 3's surface is attn_ops.flash_attn3_interface; attn_ops.flash_attn_shim serves both under
FlashAttention's own module names.
"""

from typing import Optional, Tuple, Union

from torch import Tensor

from . import ops
from ._flash_attn_kvcache import FP8, kvcache_step, last_dim_contiguous, sink_logits

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
]


def _check_supported(q: Tensor, dropout_p: float = 0.0) -> None:
    if dropout_p > 0.0:
        raise NotImplementedError(f"attn_ops.flash_attn_interface: dropout_p > 0 is not supported, got {dropout_p}")
    if q.dtype in FP8:
        raise NotImplementedError(f"attn_ops.flash_attn_interface: fp8 inputs are not supported, got {q.dtype}")


def _result(out: Tensor, lse: Tensor, return_lse: bool):
    return (out, lse, None) if return_lse else out


def _attention(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
               sinks=None, **varlen):
    q, k, v = (last_dim_contiguous(t) for t in (q, k, v))
    out, lse = ops.attention(q, k, v, scale=softmax_scale, causal=causal, window_left=window_size[0],
                             window_right=window_size[1], softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes,
                             deterministic=deterministic, **varlen)
    return _result(out, lse, return_attn_probs)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, *, s_aux=None,
                    learnable_sink=None):
    """q [B, Tq, Hq, D], k [B, Tk, Hk, D], v [B, Tk, Hk, Dv] -> out [B, Tq, Hq, Dv] (differentiable);
    with return_attn_probs, (out, softmax_lse [B, Hq, Tq], None)."""
    _check_supported(q, dropout_p)
    sinks = sink_logits(s_aux, learnable_sink, "attn_ops.flash_attn_interface.flash_attn_func")
    return _attention(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                      return_attn_probs, sinks)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """qkv [B, T, 3, H, D] (q, k, v read as strided views, not copied)."""
    _check_supported(qkv, dropout_p)
    q, k, v = qkv.unbind(dim=2)
    return _attention(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                      return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q [B, Tq, Hq, D], kv [B, Tk, 2, Hk, D]."""
    _check_supported(q, dropout_p)
    k, v = kv.unbind(dim=2)
    return _attention(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                      return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *, s_aux=None,
                           learnable_sink=None):
    """Packed q [total_q, Hq, D], k [total_k, Hk, D], v [total_k, Hk, Dv] with int32 cu_seqlens [B + 1]
    -> out [total_q, Hq, Dv]; lse [Hq, total_q]. With block_table, k and v are paged caches
    [num_blocks, block_size, Hk, D] and sequence b's keys are its first cu_seqlens_k[b + 1] - cu_seqlens_k[b]
    cache entries (inference only)."""
    _check_supported(q, dropout_p)
    sinks = sink_logits(s_aux, learnable_sink, "attn_ops.flash_attn_interface.flash_attn_varlen_func")
    if block_table is not None:
        seqlens_k = cu_seqlens_k[1:] - cu_seqlens_k[:-1]
        out, lse = ops.attention_with_kvcache(q, k, v, seqlens_k, block_table=block_table, scale=softmax_scale,
                                              causal=causal, window_left=window_size[0],
                                              window_right=window_size[1], softcap=softcap,
                                              cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, sinks=sinks,
                                              alibi_slopes=alibi_slopes)
        return _result(out, lse, return_attn_probs)
    return _attention(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                      return_attn_probs, sinks,
                      cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                      max_seqlen_k=max_seqlen_k)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """qkv [total, 3, H, D] with cu_seqlens [B + 1]."""
    _check_supported(qkv, dropout_p)
    q, k, v = qkv.unbind(dim=1)
    return _attention(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                      return_attn_probs,
                      cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=max_seqlen,
                      max_seqlen_k=max_seqlen)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q [total_q, Hq, D], kv [total_k, 2, Hk, D]."""
    _check_supported(q, dropout_p)
    k, v = kv.unbind(dim=1)
    return _attention(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                      return_attn_probs,
                      cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                      max_seqlen_k=max_seqlen_k)


def flash_attn_with_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Optional[Tensor] = None,
    v: Optional[Tensor] = None,
    rotary_cos: Optional[Tensor] = None,
    rotary_sin: Optional[Tensor] = None,
    cache_seqlens: Optional[Union[int, Tensor]] = None,
    cache_batch_idx: Optional[Tensor] = None,
    cache_leftpad: Optional[Tensor] = None,
    block_table: Optional[Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: Optional[Tensor] = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
    *,
    s_aux: Optional[Tensor] = None,
    learnable_sink: Optional[Tensor] = None,
):
    """FlashAttention 2's decode / chunked-prefill entry point.

    q [B, Tq, Hq, D]; k_cache / v_cache contiguous [B_cache, capacity, Hk, D] or, with block_table
    [B, max_blocks], paged [num_blocks, block_size, Hk, D]. ``cache_seqlens`` (int or int32 [B]) is the
    length of each row *before* the new tokens. When ``k`` / ``v`` [B, Tnew, Hk, D] are given they are
    written into the caches in place at positions cache_seqlens[b] .. + Tnew - 1 (rotated first when
    ``rotary_cos`` / ``rotary_sin`` [seqlen_ro, rotary_dim / 2] are given; q is rotated at positions
    cache_seqlens[b] + i when causal or windowed, else at cache_seqlens[b]), then q attends to keys
    cache_leftpad[b] .. cache_seqlens[b] + Tnew - 1 of cache row cache_batch_idx[b] (bottom-right causal).
    Returns out [B, Tq, Hq, Dv], or (out, softmax_lse [B, Hq, Tq]) with return_softmax_lse.
    """
    _check_supported(q)
    sinks = sink_logits(s_aux, learnable_sink, "attn_ops.flash_attn_interface.flash_attn_with_kvcache")
    capacity = k_cache.shape[1] if block_table is None else block_table.shape[1] * k_cache.shape[1]
    # FlashAttention 2 drops a window side that spans the cache (>= its capacity) before it picks the rotary
    # query positions: consecutive when causal or windowed, all at cache_seqlens[b] else.
    windowed = any(0 <= side < capacity for side in window_size)
    out, lse = kvcache_step(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                            cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
                            rotary_interleaved, rotate_q_consecutive=causal or windowed, sinks=sinks,
                            alibi_slopes=alibi_slopes, num_splits=num_splits)
    return (out, lse) if return_softmax_lse else out
