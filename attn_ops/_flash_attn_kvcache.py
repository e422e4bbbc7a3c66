"""The decode / chunked-prefill step shared by FlashAttention 2's and 3's ``flash_attn_with_kvcache``
(attn_ops.flash_attn_interface, attn_ops.flash_attn3_interface): rotate q and the new keys, append the new
keys / values to the cache in place, attend over the cache.

Everything is a thin mapping onto attn_ops ops with static shapes (no Python loop over the batch, no host
synchronization on CUDA), so it compiles with ``torch.compile(fullgraph=True)``.
"""

from typing import Optional

import torch
from torch import Tensor

from . import ops

FP8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
            if hasattr(torch, n))

_OP = "attn_ops.flash_attn_with_kvcache"


def last_dim_contiguous(x: Optional[Tensor]) -> Optional[Tensor]:
    """FlashAttention's wrappers copy an input whose last dim is strided; the ops refuse one."""
    return x if x is None or x.stride(-1) == 1 else x.contiguous()


def _reads_values(*tensors: Tensor) -> bool:
    """Whether index values may be read on the host here: CPU tensors, eager mode (no device sync, no
    graph break)."""
    return not torch.compiler.is_compiling() and all(not t.is_cuda for t in tensors)


def token_rows(cu: Tensor, count: int) -> Tensor:
    """The sequence (batch row) of each of ``count`` packed tokens delimited by ``cu`` [B + 1]."""
    return torch.searchsorted(cu[1:].contiguous(), torch.arange(count, device=cu.device, dtype=cu.dtype),
                              right=True)


def _last_writer_wins(slots: Tensor) -> Tensor:
    """``slots`` [N] with every repeated slot but its last occurrence (the highest batch row) set to -1 (skipped
    by the append): duplicates in cache_batch_idx resolve as in ``kv_cache_append``, deterministically."""
    if slots.numel() < 2:
        return slots
    order = torch.sort(slots, stable=True).indices
    ordered = slots[order]
    last = torch.ones_like(ordered, dtype=torch.bool)
    last[:-1] = ordered[:-1] != ordered[1:]
    keep = torch.empty_like(last).scatter_(0, order, last)
    return torch.where(keep, slots, torch.full_like(slots, -1))


def _slots(pos: Tensor, tok_b: Tensor, lens: Tensor, added: Tensor, rows: Optional[Tensor],
           block_table: Optional[Tensor], k_cache: Tensor, capacity: int) -> Tensor:
    """The cache slot of each new token (cache position ``pos`` [N] of batch row ``tok_b`` [N]) in the cache
    seen as paged: blocks of ``k_cache.shape[1]`` positions (a contiguous cache is one block per row).

    Checked before the append where the values can be read without a device sync (CPU), so that a bad row
    writes nothing: a position past the capacity or, paged, an unassigned block (-1 at offset block_size - 1
    would become slot -1, skipped, while the other rows' tokens were written). On CUDA such tokens are skipped
    and attention_with_kvcache's device-side checks end the context."""
    block_size = k_cache.shape[1]
    row = tok_b if rows is None else rows.long()[tok_b]
    col = pos // block_size
    width = 1 if block_table is None else block_table.shape[1]
    check = _reads_values(pos) and pos.numel() > 0
    if check:
        over = (pos >= capacity).nonzero()
        if over.numel():
            b = int(tok_b[over[0, 0]])
            where = "" if block_table is None else f" (block_table width {width} x block_size {block_size})"
            raise RuntimeError(f"{_OP}: cache_seqlens[{b}] = {int(lens[b])} plus {int(added[b])} new tokens exceeds "
                               f"the cache capacity {capacity}{where}")
    fits = pos < capacity
    if block_table is None:
        blocks = row
    else:
        blocks = block_table.long().flatten()[row * width + torch.where(fits, col, torch.zeros_like(col))]
        if check:
            bad = ((blocks < 0) | (blocks >= k_cache.shape[0])).nonzero()
            if bad.numel():
                i = int(bad[0, 0])
                raise RuntimeError(f"{_OP}: block_table[{int(row[i])}, {int(col[i])}] = {int(blocks[i])} is out of "
                                   f"range [0, {k_cache.shape[0]})")
    slots = torch.where(fits, blocks * block_size + pos % block_size, torch.full_like(pos, -1))
    return slots if rows is None else _last_writer_wins(slots)


def _adjacent(first: Tensor, second: Tensor) -> bool:
    """Whether ``second`` directly follows ``first`` along the last dim in one buffer, with the same strides: [first ;
    second] is then a view (MLA caches hold the latent and the rope part of a token side by side)."""
    return (not torch.compiler.is_compiling()  # no data pointers while tracing: the keys are then a copy
            and first.dtype == second.dtype and first.device == second.device and first.shape[:-1] == second.shape[:-1]
            and first.stride() == second.stride() and first.stride(-1) == 1
            and first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()
            and second.data_ptr() == first.data_ptr() + first.shape[-1] * first.element_size())


def with_qv(q: Tensor, qv: Optional[Tensor], k: Tensor, v: Tensor):
    """(queries, keys) whose scores are FlashAttention 3's ``q . k + qv . v``: [q ; qv] against [k ; v] (qv
    [.., Hq, Dv] beside q [.., Hq, D]; MLA's absorbed attention has q the rope part and qv the latent one). Where
    v and k sit side by side in one buffer the keys are a view of it (in that order); otherwise they are a copy,
    as large as the keys and values."""
    if qv is None:
        return q, k
    if qv.shape[:-1] != q.shape[:-1] or qv.shape[-1] != v.shape[-1]:
        raise ValueError(f"{_OP}: qv must have q's shape with v's head dim ([..., {q.shape[-2]}, {v.shape[-1]}]), "
                         f"got {list(qv.shape)} (q {list(q.shape)}, v {list(v.shape)})")
    for first, second, queries in ((k, v, (q, qv)), (v, k, (qv, q))):
        if _adjacent(first, second):
            keys = first.as_strided((*first.shape[:-1], first.shape[-1] + second.shape[-1]), first.stride())
            return torch.cat(queries, dim=-1), keys
    return torch.cat([q, qv], dim=-1), torch.cat([k, v], dim=-1)


def sink_logits(s_aux: Optional[Tensor], learnable_sink: Optional[Tensor], where: str) -> Optional[Tensor]:
    """The attention sinks of a FlashAttention-compatible call ([Hq] logits, attn_ops.attention's ``sinks``),
    under either name callers use: vLLM's ``s_aux`` or FlashAttention 4's ``learnable_sink``."""
    if s_aux is not None and learnable_sink is not None:
        raise ValueError(f"{where}: give the attention sinks as s_aux or as learnable_sink, not both")
    return learnable_sink if s_aux is None else s_aux


def kvcache_step(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor], v: Optional[Tensor],
                 rotary_cos: Optional[Tensor], rotary_sin: Optional[Tensor], cache_seqlens, cache_batch_idx,
                 cache_leftpad, block_table, softmax_scale, causal: bool, window_size, softcap: float,
                 rotary_interleaved: bool, *, rotate_q_consecutive: bool, cu_seqlens_q: Optional[Tensor] = None,
                 max_seqlen_q: Optional[int] = None, cu_seqlens_k_new: Optional[Tensor] = None,
                 rotary_seqlens: Optional[Tensor] = None, qv: Optional[Tensor] = None,
                 sinks: Optional[Tensor] = None, attention_chunk: int = 0,
                 alibi_slopes: Optional[Tensor] = None, num_splits: int = 0):
    """FlashAttention's kvcache step; returns ``(out, lse)``.

    q is ``[B, Tq, Hq, D]``, or packed ``[total_q, Hq, D]`` with ``cu_seqlens_q``; k / v (optional) are
    ``[B, Tnew, Hk, D]``, or packed ``[total_new, Hk, D]`` with ``cu_seqlens_k_new``. ``cache_seqlens`` (int,
    int32 [B] or None: the whole cache) counts each row's keys before the new ones, which are written at the
    following positions. Rotary positions start at ``rotary_seqlens`` (default ``cache_seqlens``); queries sit
    at consecutive positions when ``rotate_q_consecutive``, else all at the start. Duplicate cache_batch_idx
    rows: where their writes overlap, the highest batch row's tokens land (docs/flash_attn_compat.md). ``qv``
    (FlashAttention 3; like q with v's head dim): the scores are q . k + qv . v (with_qv), after q's rotation.
    ``sinks``, ``attention_chunk``, ``alibi_slopes`` and ``num_splits``: as attn_ops.attention_with_kvcache's.
    """
    q, k, v = (last_dim_contiguous(t) for t in (q, k, v))
    packed_q, packed_new = cu_seqlens_q is not None, cu_seqlens_k_new is not None
    batch = cu_seqlens_q.shape[0] - 1 if packed_q else q.shape[0]
    device = q.device
    capacity = k_cache.shape[1] if block_table is None else block_table.shape[1] * k_cache.shape[1]
    if k is None:
        added = torch.zeros(batch, dtype=torch.int32, device=device)
    elif packed_new:
        added = (cu_seqlens_k_new[1:] - cu_seqlens_k_new[:-1]).to(torch.int32)
    else:
        added = torch.full((batch,), k.shape[1], dtype=torch.int32, device=device)
    if cache_seqlens is None:  # every row holds the whole cache
        lens = capacity - added
    elif isinstance(cache_seqlens, int):
        lens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=device)
    else:
        lens = cache_seqlens.to(torch.int32)
    rows = None if cache_batch_idx is None else cache_batch_idx.to(torch.int32)
    leftpad = None if cache_leftpad is None else cache_leftpad.to(torch.int32)

    # the new tokens, flattened: batch row and cache position of each
    if k is not None:
        if packed_new:
            tok_b = token_rows(cu_seqlens_k_new, k.shape[0])
            offset = torch.arange(k.shape[0], device=device) - cu_seqlens_k_new.long()[tok_b]
        else:
            tok_b = torch.arange(batch, device=device).repeat_interleave(k.shape[1])
            offset = torch.arange(k.shape[1], device=device).repeat(batch)
        pos = lens.long()[tok_b] + offset

    if rotary_cos is not None:
        base = (lens if rotary_seqlens is None else rotary_seqlens.to(torch.int32)).long()
        step = 1 if rotate_q_consecutive else 0
        if packed_q:
            q_b = token_rows(cu_seqlens_q, q.shape[0])
            q_pos = base[q_b] + step * (torch.arange(q.shape[0], device=device) - cu_seqlens_q.long()[q_b])
        else:
            q_pos = base[:, None] + step * torch.arange(q.shape[1], device=device)
        q = ops.rotary_embedding(q, rotary_cos, rotary_sin, q_pos, interleaved=rotary_interleaved)
        if k is not None:
            k_pos = base[tok_b] + offset
            k_pos = k_pos if packed_new else k_pos.view(k.shape[:2])
            k = ops.rotary_embedding(k, rotary_cos, rotary_sin, k_pos, interleaved=rotary_interleaved)

    if k is not None:
        if block_table is None and not packed_new:
            ops.kv_cache_append(k_cache, v_cache, k, v, lens, cache_batch_idx=rows)
        else:
            slots = _slots(pos, tok_b, lens, added, rows, block_table, k_cache, capacity)
            flat = (lambda t: t) if packed_new else (lambda t: t.flatten(0, 1))
            ops.paged_kv_cache_append(k_cache, v_cache, flat(k), flat(v), slots)
        lens = lens + added

    q, keys = with_qv(q, last_dim_contiguous(qv), k_cache, v_cache)
    return ops.attention_with_kvcache(q, keys, v_cache, lens, block_table=block_table, scale=softmax_scale,
                                      causal=causal, window_left=window_size[0], window_right=window_size[1],
                                      softcap=softcap, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                                      cache_batch_idx=rows, cache_leftpad=leftpad, sinks=sinks,
                                      attention_chunk=attention_chunk, alibi_slopes=alibi_slopes,
                                      num_splits=num_splits)
