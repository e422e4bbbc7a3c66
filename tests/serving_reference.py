"""Independent float64 references for serving batches (docs/kvcache_api.md, "Serving batches"):
packed queries (cu_seqlens_q), cache row selection (cache_batch_idx) and left padding
(cache_leftpad) for attention_with_kvcache and mla_decode, and cache_batch_idx for the appends.

Each batch row is computed on its own: gather its keys (cache positions cache_leftpad[b] ..
cache_seqlens[b] - 1 of cache row cache_batch_idx[b], or of block-table row cache_batch_idx[b] for
a paged cache) into a dense tensor with plain indexing, then call the existing dense references
(reference.attention_ref, mla_reference.mla_decode_ref) with that row's queries.
"""

import torch

from mla_reference import mla_decode_ref
from reference import attention_ref, row_slopes


def row_keys(cache, row, first, end, block_table=None):
    """Cache positions first .. end - 1 of cache row `row` (block-table row when paged): [n, ...]."""
    if block_table is None:
        return cache[row, first:end]
    bs = cache.shape[1]
    pos = torch.arange(first, end)
    blocks = block_table[row].long().cpu()[pos // bs]
    return cache[blocks, pos % bs]


def _rows(B, cache_batch_idx, cache_leftpad, cu_seqlens_q, Tq):
    idx = list(range(B)) if cache_batch_idx is None else cache_batch_idx.cpu().tolist()
    pad = [0] * B if cache_leftpad is None else cache_leftpad.cpu().tolist()
    cu = [b * Tq for b in range(B + 1)] if cu_seqlens_q is None else cu_seqlens_q.cpu().tolist()
    return idx, pad, cu


def attention_with_kvcache_serving_ref(q, k_cache, v_cache, cache_seqlens, *, block_table=None,
                                       cu_seqlens_q=None, cache_batch_idx=None, cache_leftpad=None,
                                       causal=True, alibi_slopes=None, compute_dtype=torch.float64, **kw):
    """(out, lse): dense [B, Tq, Hq, Dv] / [B, Hq, Tq], or packed [total_q, Hq, Dv] / [Hq, total_q];
    `kw`: scale, window_left, window_right, softcap (as reference.attention_ref)."""
    lens = cache_seqlens.cpu().tolist()
    B = len(lens)
    packed = cu_seqlens_q is not None
    idx, pad, cu = _rows(B, cache_batch_idx, cache_leftpad, cu_seqlens_q, 0 if packed else q.shape[1])
    outs, lses = [], []
    for b in range(B):
        qb = q[cu[b]:cu[b + 1]] if packed else q[b]
        k = row_keys(k_cache, idx[b], pad[b], lens[b], block_table)
        v = row_keys(v_cache, idx[b], pad[b], lens[b], block_table)
        o, l = attention_ref(qb.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), causal=causal,
                            alibi_slopes=row_slopes(alibi_slopes, b), compute_dtype=compute_dtype, **kw)
        outs.append(o[0])
        lses.append(l[0])
    if packed:
        return torch.cat(outs, 0), torch.cat(lses, 1)
    return torch.stack(outs, 0), torch.stack(lses, 0)


def mla_decode_serving_ref(q_latent, q_rope, latent_cache, cache_seqlens, *, scale, block_table=None,
                           causal=True, cu_seqlens_q=None, cache_batch_idx=None, cache_leftpad=None,
                           compute_dtype=torch.float64, p_dtype=None):
    """(out_latent, lse) of mla_decode with the serving arguments, one row at a time."""
    lens = cache_seqlens.cpu().tolist()
    B = len(lens)
    packed = cu_seqlens_q is not None
    idx, pad, cu = _rows(B, cache_batch_idx, cache_leftpad, cu_seqlens_q, 0 if packed else q_latent.shape[1])
    outs, lses = [], []
    for b in range(B):
        ql = q_latent[cu[b]:cu[b + 1]] if packed else q_latent[b]
        qr = q_rope[cu[b]:cu[b + 1]] if packed else q_rope[b]
        rows = row_keys(latent_cache, idx[b], pad[b], lens[b], block_table)
        n = torch.tensor([rows.shape[0]], dtype=torch.int32)
        o, l = mla_decode_ref(ql.unsqueeze(0), qr.unsqueeze(0), rows.unsqueeze(0), n, scale=scale, causal=causal,
                              compute_dtype=compute_dtype, p_dtype=p_dtype)
        outs.append(o[0])
        lses.append(l[0])
    if packed:
        return torch.cat(outs, 0), torch.cat(lses, 1)
    return torch.stack(outs, 0), torch.stack(lses, 0)


def kv_cache_append_rows_ref_(k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx):
    """k_cache[cache_batch_idx[b], cache_seqlens[b] + t] = k[b, t] (same for v)."""
    T = k.shape[1]
    for b, (row, L) in enumerate(zip(cache_batch_idx.tolist(), cache_seqlens.tolist())):
        k_cache[row, L:L + T] = k[b]
        v_cache[row, L:L + T] = v[b]


def mla_cache_append_rows_ref_(latent_cache, c_kv, k_pe, cache_seqlens, cache_batch_idx):
    """latent_cache[cache_batch_idx[b], cache_seqlens[b] + t] = [c_kv[b, t] ; k_pe[b, t]]."""
    d_c, T = c_kv.shape[-1], c_kv.shape[1]
    for b, (row, L) in enumerate(zip(cache_batch_idx.tolist(), cache_seqlens.tolist())):
        latent_cache[row, L:L + T, :d_c] = c_kv[b]
        latent_cache[row, L:L + T, d_c:] = k_pe[b]
