"""Independent references and input builders for the KV-cache ops (docs/kvcache_api.md).

References, in plain PyTorch:
- the cache appends are written as plain indexing (a copy is exact, so the tests compare bits);
- attention over a cache gathers each row's first cache_seqlens[b] keys from the contiguous cache,
  or from the paged cache through block_table, into a dense [1, L, Hkv, D] tensor and calls
  reference.attention_ref with the row's Tq queries and Tk = L, one row at a time (bottom-right
  alignment then puts query i at position L - Tq + i, as the contract says).

Builders: cache layouts (contiguous and strided views of a larger buffer), paged caches with
shuffled (non-identity) block assignment, slot mappings.
"""

import torch

from reference import attention_ref, make_bshd, row_slopes


# --------------------------------------------------------------------------------------------------
# Cache appends (in place on the given tensors: apply them to clones)
# --------------------------------------------------------------------------------------------------
def kv_cache_append_ref_(k_cache, v_cache, k, v, cache_seqlens):
    """k_cache[b, cache_seqlens[b] + t] = k[b, t] (same for v), t < Tnew."""
    T = k.shape[1]
    for b, L in enumerate(cache_seqlens.cpu().tolist()):
        k_cache[b, L:L + T] = k[b]
        v_cache[b, L:L + T] = v[b]


def paged_kv_cache_append_ref_(k_cache, v_cache, k, v, slot_mapping):
    """Token i goes to block slot // block_size, offset slot % block_size; slot -1 skips it."""
    bs = k_cache.shape[1]
    for i, s in enumerate(slot_mapping.cpu().tolist()):
        if s == -1:
            continue
        k_cache[s // bs, s % bs] = k[i]
        v_cache[s // bs, s % bs] = v[i]


# --------------------------------------------------------------------------------------------------
# Attention over a cache
# --------------------------------------------------------------------------------------------------
def gather_cache_row(cache, b, L, block_table=None):
    """The first L entries of row b: [L, Hkv, D] (a dense copy when the cache is paged)."""
    if block_table is None:
        return cache[b, :L]
    bs = cache.shape[1]
    nblk = -(-L // bs)
    blocks = block_table[b, :nblk].long()
    return cache[blocks].reshape(nblk * bs, *cache.shape[2:])[:L]


def attention_with_kvcache_ref(q, k_cache, v_cache, cache_seqlens, *, block_table=None, scale=None,
                               causal=True, window_left=-1, window_right=-1, softcap=0.0, sinks=None,
                               attention_chunk=0, alibi_slopes=None, compute_dtype=torch.float64, p_dtype=None):
    """(out [B, Tq, Hq, Dv], lse [B, Hq, Tq]) in compute_dtype, one row at a time (p_dtype: as attention_ref)."""
    outs, lses = [], []
    for b, L in enumerate(cache_seqlens.cpu().tolist()):
        k = gather_cache_row(k_cache, b, L, block_table).unsqueeze(0)
        v = gather_cache_row(v_cache, b, L, block_table).unsqueeze(0)
        o, l = attention_ref(q[b:b + 1], k, v, scale=scale, causal=causal,
                             window_left=window_left, window_right=window_right, softcap=softcap,
                             sinks=sinks, attention_chunk=attention_chunk,
                             alibi_slopes=row_slopes(alibi_slopes, b), compute_dtype=compute_dtype,
                             p_dtype=p_dtype)
        outs.append(o)
        lses.append(l)
    B, Tq, Hq = q.shape[:3]
    if not outs:
        return (q.new_zeros(0, Tq, Hq, v_cache.shape[-1], dtype=compute_dtype),
                q.new_zeros(0, Hq, Tq, dtype=compute_dtype))
    return torch.cat(outs, 0), torch.cat(lses, 0)


# --------------------------------------------------------------------------------------------------
# Builders
# --------------------------------------------------------------------------------------------------
CACHE_LAYOUTS = ["contiguous", "transposed", "sliced", "kv_fused"]


def cache_pair(kx, vx, layout="contiguous"):
    """Views (k_cache, v_cache) holding the values of kx [N0, N1, H, Dk] / vx [N0, N1, H, Dv], in a
    given memory layout (always a stride-1 last dim), and the list of buffers they live in.

    contiguous : the tensors themselves
    transposed : built [N0, H, N1, D] contiguous then .transpose(1, 2)
    sliced     : the first D columns of a [N0, N1, H, D + 3] buffer (the other columns are random)
    kv_fused   : k and v interleaved in one [N0, N1, 2, H, D] buffer (needs Dk == Dv)
    """
    if layout == "contiguous":
        k, v = kx.clone(), vx.clone()
        return k, v, [k, v]
    if layout == "transposed":
        kb, vb = kx.transpose(1, 2).contiguous(), vx.transpose(1, 2).contiguous()
        return kb.transpose(1, 2), vb.transpose(1, 2), [kb, vb]
    if layout == "sliced":
        out = []
        for x in (kx, vx):
            base = torch.randn(*x.shape[:-1], x.shape[-1] + 3, dtype=x.dtype, device=x.device)
            base[..., :x.shape[-1]] = x
            out.append((base[..., :x.shape[-1]], base))
        return out[0][0], out[1][0], [out[0][1], out[1][1]]
    if layout == "kv_fused":
        assert kx.shape == vx.shape
        base = torch.stack([kx, vx], dim=2).contiguous()
        return base[:, :, 0], base[:, :, 1], [base]
    raise ValueError(layout)


def twin(view, base, base_copy):
    """The view of base_copy that `view` is of base (same sizes, strides, offset)."""
    assert view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert base.storage_offset() == 0 and base_copy.is_contiguous() and base.is_contiguous()
    return base_copy.as_strided(view.size(), view.stride(), view.storage_offset())


def shuffled_block_table(B, max_blocks, num_blocks, device="cpu"):
    """int32 [B, max_blocks] of distinct blocks in random (non-identity) order."""
    assert num_blocks >= B * max_blocks
    while True:
        perm = torch.randperm(num_blocks)[:B * max_blocks]
        if B * max_blocks <= 1 or not torch.equal(perm, torch.arange(B * max_blocks)):
            break
    return perm.reshape(B, max_blocks).to(torch.int32).to(device)


def paged_from_dense(kx, vx, block_size, *, extra_blocks=3, layout="contiguous"):
    """Scatter dense caches kx [B, capacity, H, Dk], vx [B, capacity, H, Dv] (capacity a multiple of
    block_size) into paged caches with shuffled blocks and `extra_blocks` spare random blocks.

    Returns (k_cache, v_cache, block_table int32 [B, capacity // block_size], buffers).
    """
    B, cap = kx.shape[:2]
    assert cap % block_size == 0
    mb = cap // block_size
    nb = B * mb + extra_blocks
    bt = shuffled_block_table(B, mb, nb, kx.device)
    kp = torch.randn(nb, block_size, *kx.shape[2:], dtype=kx.dtype, device=kx.device)
    vp = torch.randn(nb, block_size, *vx.shape[2:], dtype=vx.dtype, device=vx.device)
    idx = bt.long().reshape(-1)
    kp[idx] = kx.reshape(B * mb, block_size, *kx.shape[2:])
    vp[idx] = vx.reshape(B * mb, block_size, *vx.shape[2:])
    k_cache, v_cache, bufs = cache_pair(kp, vp, layout)
    return k_cache, v_cache, bt, bufs


def slots_for(block_table, block_size, rows_positions):
    """Slot of (row b, position p) for each pair, in the given order: block_table[b, p // bs] * bs
    + p % bs (python ints)."""
    bt = block_table.cpu().tolist()
    return [bt[b][p // block_size] * block_size + p % block_size for b, p in rows_positions]


def kvcache_inputs(B, Tq, Hq, Hkv, Dk, Dv, lens, *, dtype=torch.float32, device="cpu",
                   capacity=None, block_size=None, q_layout="contiguous",
                   cache_layout="contiguous", extra_blocks=3):
    """q [B, Tq, Hq, Dk], caches (contiguous, or paged when block_size is given) whose entries past
    each row's length are random too (a kernel that reads them gets a wrong result), cache_seqlens.

    Returns (q, k_cache, v_cache, cache_seqlens, block_table or None).
    """
    assert len(lens) == B
    if capacity is None:
        capacity = max(list(lens) + [1]) + 5
    if block_size is not None:
        capacity = -(-capacity // block_size) * block_size
    q = make_bshd(B, Tq, Hq, Dk, dtype=dtype, device=device, layout=q_layout)
    kx = torch.randn(B, capacity, Hkv, Dk, dtype=dtype, device=device)
    vx = torch.randn(B, capacity, Hkv, Dv, dtype=dtype, device=device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    if block_size is None:
        k_cache, v_cache, _ = cache_pair(kx, vx, cache_layout)
        return q, k_cache, v_cache, seqlens, None
    k_cache, v_cache, bt, _ = paged_from_dense(kx, vx, block_size, extra_blocks=extra_blocks,
                                               layout=cache_layout)
    return q, k_cache, v_cache, seqlens, bt
