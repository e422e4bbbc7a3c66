"""Serving batches on the CPU (docs/kvcache_api.md, "Serving batches"): packed queries with
cu_seqlens_q, cache_batch_idx and cache_leftpad for attention_with_kvcache and mla_decode, and
cache_batch_idx for kv_cache_append / mla_cache_append; each alone and all combined, against the
float64 references of serving_reference.py with the tolerance rule of reference.py. Also opcheck and
a compiled (fullgraph) serving step. The same on CUDA (compared against the reference when a GPU is
present).
"""

import pytest
import torch
from torch.library import opcheck

import attn_ops
from reference import assert_close_to_ref, same_dtype_ref
from serving_reference import (attention_with_kvcache_serving_ref, kv_cache_append_rows_ref_,
                               mla_cache_append_rows_ref_, mla_decode_serving_ref)


def i32(x):
    return torch.tensor(x, dtype=torch.int32)


def cu_of(lens_q):
    return i32([0] + torch.tensor(lens_q).cumsum(0).tolist())


def paged_pool(rows, capacity, block_size, shape, dtype):
    """A paged cache [num_blocks, block_size, *shape] of random values (spare blocks included) and a
    block table [rows, capacity // block_size] of distinct shuffled blocks."""
    mb = -(-capacity // block_size)
    nb = rows * mb + 3
    table = torch.randperm(nb)[:rows * mb].reshape(rows, mb).to(torch.int32)
    return torch.randn(nb, block_size, *shape, dtype=dtype), table


def serving_inputs(lens_q, lens_k, *, Hq=4, Hkv=2, D=32, Dv=None, pool_rows=None, block_size=None,
                   leftpad=None, dtype=torch.float32, packed=True):
    """q (packed [total_q, Hq, D], or dense [B, Tq, Hq, D]), caches (a pool of `pool_rows` rows, or
    paged), cache_seqlens and the serving keyword arguments."""
    B = len(lens_q)
    Dv = Dv or D
    rows = pool_rows or B
    capacity = max(lens_k) + 5
    if packed:
        q = torch.randn(sum(lens_q), Hq, D, dtype=dtype)
    else:
        q = torch.randn(B, lens_q[0], Hq, D, dtype=dtype)
    kw = {}
    if block_size is None:
        k_cache = torch.randn(rows, capacity, Hkv, D, dtype=dtype)
        v_cache = torch.randn(rows, capacity, Hkv, Dv, dtype=dtype)
    else:
        k_cache, table = paged_pool(rows, capacity, block_size, (Hkv, D), dtype)
        v_cache = torch.randn(k_cache.shape[0], block_size, Hkv, Dv, dtype=dtype)
        kw["block_table"] = table
    if packed:
        kw["cu_seqlens_q"] = cu_of(lens_q)
        kw["max_seqlen_q"] = max(lens_q)
    if pool_rows is not None:
        kw["cache_batch_idx"] = i32(torch.randperm(pool_rows)[:B].tolist())
    if leftpad is not None:
        kw["cache_leftpad"] = i32(leftpad)
    return q, k_cache, v_cache, i32(lens_k), kw


def check(q, k_cache, v_cache, seqlens, kw, **opts):
    out, lse = attn_ops.attention_with_kvcache(q, k_cache, v_cache, seqlens, **kw, **opts)
    ref_kw = {k: v for k, v in kw.items() if k != "max_seqlen_q"}
    ref = attention_with_kvcache_serving_ref(q, k_cache, v_cache, seqlens, **ref_kw, **opts)
    same = same_dtype_ref(attention_with_kvcache_serving_ref, q, k_cache, v_cache, seqlens, **ref_kw, **opts,
                          compute_dtype=q.dtype)
    assert_close_to_ref(out, ref[0], same[0], name="out")
    assert_close_to_ref(lse, ref[1], same[1], name="lse")
    return out, lse


# Query counts per row from 0 to 300 in one batch: decode rows, a long prefill chunk, an empty row.
LENS_Q = [1, 300, 0, 7, 1]
LENS_K = [40, 333, 12, 7, 1]


# --------------------------------------------------------------------------------------------------
# Each argument alone
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("block_size", [None, 1, 16])
@pytest.mark.parametrize("Hq,Hkv", [(4, 4), (4, 2), (4, 1)])
def test_packed_queries(block_size, Hq, Hkv):
    check(*serving_inputs(LENS_Q, LENS_K, Hq=Hq, Hkv=Hkv, block_size=block_size))


@pytest.mark.parametrize("block_size", [None, 16])
def test_cache_batch_idx(block_size):
    # dense q [3, 2, ...] over a pool of 7 cache (or block-table) rows, rows picked out of order
    check(*serving_inputs([2, 2, 2], [9, 30, 2], pool_rows=7, block_size=block_size, packed=False))


@pytest.mark.parametrize("block_size", [None, 1, 16])
def test_cache_leftpad(block_size):
    # keys start at the pad; one row padded up to its length (no key left), one not padded
    check(*serving_inputs([3, 3, 3, 3], [20, 37, 5, 9], leftpad=[4, 17, 5, 0], block_size=block_size,
                          packed=False))


def cuda_kw(kw):
    return {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}


# The serving arguments on CUDA, alone and combined: packed rows, a pool of 9 rows picked out of order, left
# padding (one row padded up to its length).
CUDA_EXTRAS = {"packed": {}, "batch_idx": dict(pool_rows=9), "leftpad": dict(leftpad=[3, 20, 12, 0, 0]),
               "all": dict(pool_rows=9, leftpad=[3, 20, 12, 0, 0])}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
@pytest.mark.parametrize("block_size", [None, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("extras", list(CUDA_EXTRAS))
def test_serving_cuda(block_size, dtype, extras):
    q, kc, vc, lens, kw = serving_inputs(LENS_Q, LENS_K, Hq=8, Hkv=2, D=64, block_size=block_size, dtype=dtype,
                                         **CUDA_EXTRAS[extras])
    opts = dict(window_left=50, softcap=8.0) if extras == "all" else {}
    out, lse = attn_ops.attention_with_kvcache(q.cuda(), kc.cuda(), vc.cuda(), lens.cuda(), **cuda_kw(kw), **opts)
    ref_kw = {k: v for k, v in kw.items() if k != "max_seqlen_q"}
    ref = attention_with_kvcache_serving_ref(q, kc, vc, lens, **ref_kw, **opts)
    same = same_dtype_ref(attention_with_kvcache_serving_ref, q, kc, vc, lens, **ref_kw, **opts,
                          compute_dtype=dtype)
    assert_close_to_ref(out.cpu(), ref[0], same[0], name="out")
    assert_close_to_ref(lse.cpu(), ref[1], same[1], name="lse")


def test_packed_equals_dense():
    """Packed rows of equal length give the dense call's result, bit for bit."""
    q, kc, vc, lens, _ = serving_inputs([3, 3], [10, 20], packed=False)
    dense = attn_ops.attention_with_kvcache(q, kc, vc, lens)
    packed = attn_ops.attention_with_kvcache(q.reshape(6, *q.shape[2:]), kc, vc, lens, cu_seqlens_q=i32([0, 3, 6]))
    assert torch.equal(packed[0], dense[0].reshape(6, *q.shape[2:]))
    assert torch.equal(packed[1], dense[1].permute(1, 0, 2).reshape(q.shape[2], 6))


# --------------------------------------------------------------------------------------------------
# Combined: packed q + paged cache + cache_batch_idx + leftpad + window + softcap
# --------------------------------------------------------------------------------------------------
COMBINED_OPTS = [dict(window_left=50, softcap=8.0), dict(causal=False, window_left=3, window_right=2)]
# float32 over every cache layout; bfloat16 and float64 over the paged one (time budget)
COMBINED = [(torch.float32, bs, o) for bs in (None, 1, 16) for o in COMBINED_OPTS] + \
    [(dt, 16, o) for dt in (torch.bfloat16, torch.float64) for o in COMBINED_OPTS]


@pytest.mark.parametrize("dtype,block_size,opts", COMBINED, ids=str)
def test_all_combined(dtype, block_size, opts):
    check(*serving_inputs(LENS_Q, LENS_K, Hq=6, Hkv=2, Dv=24, pool_rows=9, block_size=block_size,
                          leftpad=[3, 20, 12, 0, 0], dtype=dtype), **opts)


def test_nan_stays_in_its_row():
    """NaN in one packed row's query reaches that row's outputs only."""
    q, kc, vc, lens, kw = serving_inputs([2, 3, 1], [5, 6, 4], pool_rows=4)
    q[2, 1, 0] = float("nan")  # row 1, query 0, head 1
    out, lse = attn_ops.attention_with_kvcache(q, kc, vc, lens, **kw)
    assert torch.isnan(out[2, 1]).all() and torch.isnan(lse[1, 2])
    nan_free = torch.ones(6, dtype=torch.bool)
    nan_free[2] = False
    assert not torch.isnan(out[nan_free]).any() and not torch.isnan(out[2, [0, 2, 3]]).any()


# --------------------------------------------------------------------------------------------------
# MLA
# --------------------------------------------------------------------------------------------------
def mla_serving_inputs(lens_q, lens_k, *, H=4, d_c=64, d_rope=16, pool_rows=None, block_size=None, leftpad=None,
                       dtype=torch.float32):
    B = len(lens_q)
    rows = pool_rows or B
    cap = max(lens_k) + 3
    kw = {"cu_seqlens_q": cu_of(lens_q)}
    if block_size is None:
        cache = torch.randn(rows, cap, d_c + d_rope, dtype=dtype)
    else:
        cache, kw["block_table"] = paged_pool(rows, cap, block_size, (d_c + d_rope,), dtype)
    if pool_rows is not None:
        kw["cache_batch_idx"] = i32(torch.randperm(pool_rows)[:B].tolist())
    if leftpad is not None:
        kw["cache_leftpad"] = i32(leftpad)
    ql = torch.randn(sum(lens_q), H, d_c, dtype=dtype)
    qr = torch.randn(sum(lens_q), H, d_rope, dtype=dtype)
    return ql, qr, cache, i32(lens_k), kw


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [None, 16])
@pytest.mark.parametrize("extras", ["packed", "all"])
def test_mla_decode_serving(dtype, block_size, extras):
    more = dict(pool_rows=6, leftpad=[0, 30, 2, 1]) if extras == "all" else {}
    ql, qr, cache, lens, kw = mla_serving_inputs([1, 200, 0, 4], [17, 230, 3, 9], block_size=block_size, dtype=dtype,
                                                 **more)
    scale = 0.11
    out, lse = attn_ops.mla_decode(ql, qr, cache, lens, scale=scale, **kw)
    ref = mla_decode_serving_ref(ql, qr, cache, lens, scale=scale, **kw)
    same = same_dtype_ref(mla_decode_serving_ref, ql, qr, cache, lens, scale=scale, **kw, compute_dtype=dtype)
    assert_close_to_ref(out, ref[0], same[0], name="out_latent")
    assert_close_to_ref(lse, ref[1], same[1], name="lse")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
@pytest.mark.parametrize("block_size", [None, 16])
def test_mla_decode_serving_cuda(block_size):
    ql, qr, cache, lens, kw = mla_serving_inputs([1, 200, 0, 4], [17, 230, 3, 9], block_size=block_size,
                                                 dtype=torch.bfloat16, pool_rows=6, leftpad=[0, 30, 2, 1])
    out, lse = attn_ops.mla_decode(ql.cuda(), qr.cuda(), cache.cuda(), lens.cuda(), scale=0.11, **cuda_kw(kw))
    ref = mla_decode_serving_ref(ql, qr, cache, lens, scale=0.11, **kw)
    same = same_dtype_ref(mla_decode_serving_ref, ql, qr, cache, lens, scale=0.11, **kw, compute_dtype=torch.bfloat16)
    assert_close_to_ref(out.cpu(), ref[0], same[0], name="out_latent")
    assert_close_to_ref(lse.cpu(), ref[1], same[1], name="lse")


# --------------------------------------------------------------------------------------------------
# Appends with cache_batch_idx: bit-exact against plain indexing; other pool rows untouched
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kv_cache_append_batch_idx(dtype):
    kc, vc = torch.randn(6, 16, 2, 8, dtype=dtype), torch.randn(6, 16, 2, 12, dtype=dtype)
    k, v = torch.randn(3, 4, 2, 8, dtype=dtype), torch.randn(3, 4, 2, 12, dtype=dtype)
    lens, idx = i32([0, 12, 5]), i32([4, 0, 2])
    kr, vr = kc.clone(), vc.clone()
    kv_cache_append_rows_ref_(kr, vr, k, v, lens, idx)
    attn_ops.kv_cache_append(kc, vc, k, v, lens, cache_batch_idx=idx)
    assert torch.equal(kc, kr) and torch.equal(vc, vr)


def test_mla_cache_append_batch_idx():
    cache = torch.randn(5, 10, 24)
    c_kv, k_pe = torch.randn(2, 3, 16), torch.randn(2, 3, 8)
    lens, idx = i32([7, 0]), i32([3, 1])
    ref = cache.clone()
    mla_cache_append_rows_ref_(ref, c_kv, k_pe, lens, idx)
    attn_ops.mla_cache_append(cache, c_kv, k_pe, cache_seqlens=lens, cache_batch_idx=idx)
    assert torch.equal(cache, ref)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_appends_batch_idx_cuda(dtype):
    kc, vc = torch.randn(6, 16, 2, 8, dtype=dtype), torch.randn(6, 16, 2, 12, dtype=dtype)
    k, v = torch.randn(3, 4, 2, 8, dtype=dtype), torch.randn(3, 4, 2, 12, dtype=dtype)
    lens, idx = i32([0, 12, 5]), i32([4, 0, 2])
    kr, vr = kc.clone(), vc.clone()
    kv_cache_append_rows_ref_(kr, vr, k, v, lens, idx)
    kd, vd = kc.cuda(), vc.cuda()
    attn_ops.kv_cache_append(kd, vd, k.cuda(), v.cuda(), lens.cuda(), cache_batch_idx=idx.cuda())
    assert torch.equal(kd.cpu(), kr) and torch.equal(vd.cpu(), vr)
    cache = torch.randn(5, 10, 24, dtype=dtype)
    c_kv, k_pe = torch.randn(2, 3, 16, dtype=dtype), torch.randn(2, 3, 8, dtype=dtype)
    lens, idx = i32([7, 0]), i32([3, 1])
    ref = cache.clone()
    mla_cache_append_rows_ref_(ref, c_kv, k_pe, lens, idx)
    cd = cache.cuda()
    attn_ops.mla_cache_append(cd, c_kv.cuda(), k_pe.cuda(), cache_seqlens=lens.cuda(), cache_batch_idx=idx.cuda())
    assert torch.equal(cd.cpu(), ref)


# --------------------------------------------------------------------------------------------------
# opcheck and torch.compile
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("block_size", [None, 16])
def test_opcheck_attention_with_kvcache(block_size):
    q, kc, vc, lens, kw = serving_inputs([1, 9, 0], [5, 20, 3], pool_rows=5, block_size=block_size,
                                         leftpad=[1, 4, 0])
    opcheck(torch.ops.attn_ops.attention_with_kvcache.default, (q, kc, vc, lens), dict(kw, window_left=6))


def test_opcheck_mla_decode():
    ql, qr, cache, lens, kw = mla_serving_inputs([2, 1], [6, 9], pool_rows=4, leftpad=[1, 0])
    opcheck(torch.ops.attn_ops.mla_decode.default, (ql, qr, cache, lens), dict(kw, scale=0.2))


def test_opcheck_appends():
    kc, vc = torch.randn(5, 16, 2, 8), torch.randn(5, 16, 2, 8)
    opcheck(torch.ops.attn_ops.kv_cache_append.default, (kc, vc, torch.randn(2, 3, 2, 8), torch.randn(2, 3, 2, 8),
                                                         i32([1, 4])), {"cache_batch_idx": i32([3, 0])})
    opcheck(torch.ops.attn_ops.mla_cache_append.default, (torch.randn(4, 8, 12), torch.randn(2, 1, 8),
                                                          torch.randn(2, 1, 4)),
            {"cache_seqlens": i32([0, 6]), "cache_batch_idx": i32([2, 1])})


def test_compiled_serving_step():
    """Append one token per decode row into a pool, then one ragged attention call, fullgraph."""
    torch._dynamo.reset()

    def step(q, k_new, v_new, kc, vc, lens, idx, cu, pad):
        attn_ops.kv_cache_append(kc, vc, k_new, v_new, lens, cache_batch_idx=idx)
        return attn_ops.attention_with_kvcache(q, kc, vc, lens + 1, cu_seqlens_q=cu, cache_batch_idx=idx,
                                               cache_leftpad=pad)

    kc, vc = torch.randn(6, 32, 2, 16), torch.randn(6, 32, 2, 16)
    args = (torch.randn(4, 4, 16), torch.randn(3, 1, 2, 16), torch.randn(3, 1, 2, 16))
    meta = (i32([5, 9, 3]), i32([4, 1, 0]), i32([0, 1, 3, 4]), i32([0, 2, 1]))
    kc_e, vc_e = kc.clone(), vc.clone()
    eager = step(*args, kc_e, vc_e, *meta)
    compiled = torch.compile(step, fullgraph=True)(*args, kc, vc, *meta)
    assert torch.equal(kc, kc_e) and torch.equal(vc, vc_e)
    torch.testing.assert_close(compiled[0], eager[0])
    torch.testing.assert_close(compiled[1], eager[1])


def test_compiled_dynamic_total_q():
    """One compiled graph (dynamic shapes) serves steps with different packed query counts."""
    torch._dynamo.reset()

    def step(q, kc, vc, lens, cu, idx, pad):
        return attn_ops.attention_with_kvcache(q, kc, vc, lens, cu_seqlens_q=cu, cache_batch_idx=idx,
                                               cache_leftpad=pad)

    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    kc, vc = torch.randn(6, 32, 2, 16), torch.randn(6, 32, 2, 16)
    for cu, lens in (([0, 1, 3, 4], [5, 9, 3]), ([0, 2, 6, 7], [5, 12, 3]), ([0, 1, 8, 9], [5, 19, 3])):
        args = (torch.randn(cu[-1], 4, 16), kc, vc, i32(lens), i32(cu), i32([4, 1, 0]), i32([0, 2, 1]))
        ours, eager = compiled(*args), step(*args)
        assert torch.equal(ours[0], eager[0]) and torch.equal(ours[1], eager[1])
