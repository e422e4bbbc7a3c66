"""FlashAttention-2-compatible functions on top of attn_ops (docs/flash_attn_compat.md).

Code written for ``flash_attn`` runs unchanged after one import change, on CPU as well as CUDA::

    from attn_ops.flash_attn_interface import flash_attn_func, flash_attn_with_kvcache

Each function takes FlashAttention 2's arguments with its semantics and is a thin mapping onto
``attn_ops`` ops (no Python loops over the batch, no host synchronization), so it compiles with
``torch.compile(fullgraph=True)``. Not supported (a clear ``NotImplementedError``): ``dropout_p > 0``,
``alibi_slopes``, fp8 inputs. ``deterministic`` and ``num_splits`` are accepted and ignored (the
results do not depend on them). With ``return_attn_probs=True`` the functions return
``(out, softmax_lse, None)``: the lse as FlashAttention gives it, no attention probabilities (those
only exist for dropout in FlashAttention too).
"""

from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from . import ops

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
]

_FP8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
             if hasattr(torch, n))


def _check_supported(q: Tensor, dropout_p: float = 0.0, alibi_slopes: Optional[Tensor] = None) -> None:
    if dropout_p > 0.0:
        raise NotImplementedError(f"attn_ops.flash_attn_interface: dropout_p > 0 is not supported, got {dropout_p}")
    if alibi_slopes is not None:
        raise NotImplementedError("attn_ops.flash_attn_interface: alibi_slopes (ALiBi) is not supported")
    if q.dtype in _FP8:
        raise NotImplementedError(f"attn_ops.flash_attn_interface: fp8 inputs are not supported, got {q.dtype}")


def _result(out: Tensor, lse: Tensor, return_lse: bool):
    return (out, lse, None) if return_lse else out


def _last_dim_contiguous(x: Tensor) -> Tensor:
    """FlashAttention's wrappers copy an input whose last dim is strided; the ops refuse one."""
    return x if x is None or x.stride(-1) == 1 else x.contiguous()


def _attention(q, k, v, softmax_scale, causal, window_size, softcap, return_attn_probs, **varlen):
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    out, lse = ops.attention(q, k, v, scale=softmax_scale, causal=causal, window_left=window_size[0],
                             window_right=window_size[1], softcap=softcap, **varlen)
    return _result(out, lse, return_attn_probs)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q [B, Tq, Hq, D], k [B, Tk, Hk, D], v [B, Tk, Hk, Dv] -> out [B, Tq, Hq, Dv] (differentiable);
    with return_attn_probs, (out, softmax_lse [B, Hq, Tq], None)."""
    _check_supported(q, dropout_p, alibi_slopes)
    return _attention(q, k, v, softmax_scale, causal, window_size, softcap, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """qkv [B, T, 3, H, D] (q, k, v read as strided views, not copied)."""
    _check_supported(qkv, dropout_p, alibi_slopes)
    q, k, v = qkv.unbind(dim=2)
    return _attention(q, k, v, softmax_scale, causal, window_size, softcap, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q [B, Tq, Hq, D], kv [B, Tk, 2, Hk, D]."""
    _check_supported(q, dropout_p, alibi_slopes)
    k, v = kv.unbind(dim=2)
    return _attention(q, k, v, softmax_scale, causal, window_size, softcap, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """Packed q [total_q, Hq, D], k [total_k, Hk, D], v [total_k, Hk, Dv] with int32 cu_seqlens [B + 1]
    -> out [total_q, Hq, Dv]; lse [Hq, total_q]. With block_table, k and v are paged caches
    [num_blocks, block_size, Hk, D] and sequence b's keys are its first cu_seqlens_k[b + 1] - cu_seqlens_k[b]
    cache entries (inference only)."""
    _check_supported(q, dropout_p, alibi_slopes)
    if block_table is not None:
        seqlens_k = cu_seqlens_k[1:] - cu_seqlens_k[:-1]
        out, lse = ops.attention_with_kvcache(q, k, v, seqlens_k, block_table=block_table, scale=softmax_scale,
                                              causal=causal, window_left=window_size[0],
                                              window_right=window_size[1], softcap=softcap,
                                              cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q)
        return _result(out, lse, return_attn_probs)
    return _attention(q, k, v, softmax_scale, causal, window_size, softcap, return_attn_probs,
                      cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                      max_seqlen_k=max_seqlen_k)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """qkv [total, 3, H, D] with cu_seqlens [B + 1]."""
    _check_supported(qkv, dropout_p, alibi_slopes)
    q, k, v = qkv.unbind(dim=1)
    return _attention(q, k, v, softmax_scale, causal, window_size, softcap, return_attn_probs,
                      cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=max_seqlen,
                      max_seqlen_k=max_seqlen)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q [total_q, Hq, D], kv [total_k, 2, Hk, D]."""
    _check_supported(q, dropout_p, alibi_slopes)
    k, v = kv.unbind(dim=1)
    return _attention(q, k, v, softmax_scale, causal, window_size, softcap, return_attn_probs,
                      cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                      max_seqlen_k=max_seqlen_k)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor, interleaved: bool) -> Tensor:
    return ops.rotary_embedding(x, cos, sin, positions, interleaved=interleaved)


def _new_token_blocks(table: torch.Tensor, pos: torch.Tensor, block_size: int, num_blocks: int,
                      rows: Optional[torch.Tensor]) -> torch.Tensor:
    """The cache block of each new token ``pos [B, Tnew]`` (its position in its row), from the rows of
    ``block_table`` given as ``table``.

    Checked here, before the append, where the values can be read without a device sync (CPU): otherwise an
    entry of -1 at offset block_size - 1 becomes slot -1, which the append skips, and attention_with_kvcache
    rejected the table only after the other rows' tokens were written. On CUDA the device-side checks of the
    two ops (and gather's) end the context instead; under torch.compile the ops' own checks run as they can."""
    col = pos // block_size
    if table.is_cuda or pos.numel() == 0 or torch.compiler.is_compiling():  # no value reads while tracing
        return table.long().gather(1, col)
    width = table.shape[1]
    over = (col >= width).nonzero()
    if over.numel():
        b = int(over[0, 0])
        raise RuntimeError(f"attn_ops.flash_attn_with_kvcache: cache_seqlens[{b}] = {int(pos[b, 0])} plus "
                           f"{pos.shape[1]} new tokens exceeds the cache capacity {width * block_size} "
                           f"(block_table width {width} x block_size {block_size})")
    blocks = table.long().gather(1, col)
    bad = ((blocks < 0) | (blocks >= num_blocks)).nonzero()
    if bad.numel():
        b, j = bad[0].tolist()
        row = b if rows is None else int(rows[b])
        raise RuntimeError(f"attn_ops.flash_attn_with_kvcache: block_table[{row}, {int(col[b, j])}] = "
                           f"{int(blocks[b, j])} is out of range [0, {num_blocks})")
    return blocks


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
    _check_supported(q, 0.0, alibi_slopes)
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    batch, seqlen_q = q.shape[0], q.shape[1]
    capacity = k_cache.shape[1] if block_table is None else block_table.shape[1] * k_cache.shape[1]
    if cache_seqlens is None:  # every row holds the whole cache
        cache_seqlens = capacity - (0 if k is None else k.shape[1])
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    lens = cache_seqlens.to(torch.int32)
    rows = None if cache_batch_idx is None else cache_batch_idx.to(torch.int32)
    leftpad = None if cache_leftpad is None else cache_leftpad.to(torch.int32)
    seqlen_new = 0 if k is None else k.shape[1]

    if rotary_cos is not None:
        if k is not None:
            k_pos = lens[:, None] + torch.arange(seqlen_new, device=q.device, dtype=torch.int32)
            k = _rotate(k, rotary_cos, rotary_sin, k_pos, rotary_interleaved)
        # FlashAttention: queries at consecutive positions when causal / windowed, all at cache_seqlens else;
        # a window side that spans the whole cache (>= its capacity) counts as none, as FlashAttention drops it.
        windowed = any(0 <= side < capacity for side in window_size)
        step = 1 if causal or windowed else 0
        q_pos = lens[:, None] + step * torch.arange(seqlen_q, device=q.device, dtype=torch.int32)
        q = _rotate(q, rotary_cos, rotary_sin, q_pos, rotary_interleaved)

    if k is not None:
        if block_table is None:
            ops.kv_cache_append(k_cache, v_cache, k, v, lens, cache_batch_idx=rows)
        else:
            table = block_table if rows is None else block_table.index_select(0, rows)
            block_size = k_cache.shape[1]
            pos = (lens[:, None] + torch.arange(seqlen_new, device=q.device, dtype=torch.int32)).long()
            blocks = _new_token_blocks(table, pos, block_size, k_cache.shape[0], rows)
            slots = blocks * block_size + pos % block_size
            ops.paged_kv_cache_append(k_cache, v_cache, k.flatten(0, 1), v.flatten(0, 1), slots.flatten())
        lens = lens + seqlen_new

    out, lse = ops.attention_with_kvcache(q, k_cache, v_cache, lens, block_table=block_table, scale=softmax_scale,
                                          causal=causal, window_left=window_size[0], window_right=window_size[1],
                                          softcap=softcap, cache_batch_idx=rows, cache_leftpad=leftpad)
    return (out, lse) if return_softmax_lse else out
