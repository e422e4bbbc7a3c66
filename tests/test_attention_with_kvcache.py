"""attention_with_kvcache against the float64 reference (tests/kvcache_reference.py).

Every comparison uses the tolerance rule max|ours - ref64| <= 2 * max|same_dtype - ref64| + eps on
out and lse (lse -inf exactly where the reference is -inf). The cache entries past each row's length
are random, so a kernel that reads them is caught. Also, besides the reference: paged == contiguous
on the same data, and == attn_ops.attention on each row's dense prefix.
"""

import pytest
import torch

import attn_ops
from kvcache_reference import (attention_with_kvcache_ref, gather_cache_row, kvcache_inputs,
                               paged_from_dense)
from reference import assert_attention_close_to_ref, assert_close_to_ref, same_dtype_ref
from serving_reference import attention_with_kvcache_serving_ref

ALL_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
F32_BF16 = [torch.float32, torch.bfloat16]


def dtype_id(dt):
    return str(dt).replace("torch.", "")


def check_kvcache(q, k_cache, v_cache, seqlens, block_table=None, **kw):
    """Run the op, check shapes/dtypes/contiguity/inputs untouched, compare with the reference."""
    ins = (q, k_cache, v_cache, seqlens) + ((block_table,) if block_table is not None else ())
    before = [t.clone() for t in ins]
    out, lse = attn_ops.attention_with_kvcache(q, k_cache, v_cache, seqlens,
                                               block_table=block_table, **kw)
    for t, b in zip(ins, before):
        assert torch.equal(t, b), "the op modified an input"
    B, Tq, Hq = q.shape[:3]
    assert tuple(out.shape) == (B, Tq, Hq, v_cache.shape[-1])
    assert tuple(lse.shape) == (B, Hq, Tq)
    assert out.dtype == q.dtype
    assert lse.dtype == (torch.float64 if q.dtype == torch.float64 else torch.float32)
    assert out.device == q.device and lse.device == q.device
    assert out.is_contiguous()
    r_out, r_lse = attention_with_kvcache_ref(q, k_cache, v_cache, seqlens,
                                              block_table=block_table, **kw)
    s_out, s_lse = same_dtype_ref(attention_with_kvcache_ref, q, k_cache, v_cache, seqlens,
                                  block_table=block_table, **kw, compute_dtype=q.dtype)
    assert_close_to_ref(out, r_out, s_out, name="out")
    assert_close_to_ref(lse, r_lse, s_lse, name="lse")
    return out, lse, r_out, r_lse


# --------------------------------------------------------------------------------------------------
# Full dtype sweep on representative cases
# --------------------------------------------------------------------------------------------------
# name: (Tq, Hq, Hkv, Dk, Dv, lens, block_size, layouts (q, cache) or None, kwargs)
CASES = {
    "decode_contig": (1, 8, 2, 64, 64, [37, 1, 100], None, None, {}),
    "decode_paged16": (1, 8, 2, 64, 64, [37, 1, 100], 16, None, {}),
    "chunk_tq4_paged1": (4, 4, 4, 32, 32, [5, 30, 4], 1, None, {}),
    "tq4_full_window_contig": (4, 4, 2, 64, 64, [40, 9], None, None,
                               dict(causal=False, window_left=8, window_right=2)),
    "softcap_scale_paged64": (4, 4, 1, 64, 64, [70, 130], 64, None,
                              dict(softcap=10.0, scale=0.2)),
    "mqa_empty_row_paged16": (1, 8, 1, 64, 64, [0, 17, 9], 16, None, {}),
    "dk128_dv64_causal_window": (4, 4, 2, 128, 64, [33, 65], None, None, dict(window_left=16)),
    "views_paged16": (4, 4, 2, 64, 64, [20, 50], 16, ("transposed", "transposed"), {}),
    "views_contig_fused": (1, 4, 2, 64, 64, [20, 50], None, ("sliced", "kv_fused"), {}),
    # [B, Hkv, T, D] caches as transposed views: the decode kernel's one-KV-head work items
    "decode_head_major": (1, 8, 4, 64, 48, [37, 1, 100, 0], None, ("contiguous", "transposed"),
                          dict(window_left=40, softcap=5.0)),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_kvcache_dtypes(case, dtype, device):
    Tq, Hq, Hkv, Dk, Dv, lens, bs, layouts, kw = CASES[case]
    ql, cl = layouts or ("contiguous", "contiguous")
    q, kc, vc, sl, bt = kvcache_inputs(len(lens), Tq, Hq, Hkv, Dk, Dv, lens, dtype=dtype,
                                       device=device, block_size=bs, q_layout=ql, cache_layout=cl)
    check_kvcache(q, kc, vc, sl, bt, **kw)


@pytest.mark.parametrize("k_major,v_major", [(True, True), (True, False), (False, True)],
                         ids=["both", "k_only", "v_only"])
@pytest.mark.parametrize("tq,hq,hkv,dk,dv,lens", [
    (1, 32, 8, 128, 128, [300, 0, 1, 129]),   # GQA decode, one row per KV head item
    (2, 12, 3, 80, 96, [70, 2, 65]),          # two positions, head dims past whole vectors
    (1, 8, 2, 64, 64, [2500]),                # one long row: key splits of the one-head items
    (3, 4, 4, 32, 32, [9, 40]),               # MHA, three positions
], ids=["gqa32_8", "tq2_d80_96", "long_row", "mha_tq3"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_kvcache_head_major_cache(dtype, tq, hq, hkv, dk, dv, lens, k_major, v_major, device):
    # A cache whose heads' rows are each contiguous ([B, Hkv, T, D] viewed as [B, T, Hkv, D], as HF
    # keeps it) runs the decode kernel one KV head per work item; a mix of layouts takes all heads
    B, cap = len(lens), max(lens) + 7
    q = torch.randn(B, tq, hq, dk, dtype=dtype, device=device)

    def cache(dim, head_major):
        if head_major:
            return torch.randn(B, hkv, cap, dim, dtype=dtype, device=device).transpose(1, 2)
        return torch.randn(B, cap, hkv, dim, dtype=dtype, device=device)

    kc, vc = cache(dk, k_major), cache(dv, v_major)
    sl = torch.tensor(lens, dtype=torch.int32, device=device)
    check_kvcache(q, kc, vc, sl, causal=True)
    check_kvcache(q, kc, vc, sl, causal=False, window_left=33, softcap=8.0)


@pytest.mark.parametrize("block_size", [1, 5, 16, 64])
@pytest.mark.parametrize("tq,hq,hkv,dk,dv,lens", [
    (1, 32, 8, 128, 128, [300, 0, 1, 129]),   # GQA decode, one row per KV head item
    (2, 6, 3, 80, 96, [70, 2, 65]),           # two positions (4 rows per KV head), dims past whole vectors
    (1, 8, 2, 64, 64, [2500]),                # one long row: key splits of the one-head items
], ids=["gqa32_8", "tq2_d80_96", "long_row"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_kvcache_paged_head_major_blocks(dtype, tq, hq, hkv, dk, dv, lens, block_size, device):
    # Pools of [num_blocks, Hkv, block_size, D] blocks viewed as [num_blocks, block_size, Hkv, D] (PagedKVCache's
    # CPU layout): within a block each head's rows are contiguous, so the decode kernel takes one KV head per
    # work item and finds its rows through the block table; also with left padding (blocks start mid-row)
    q, kc, vc, sl, bt = kvcache_inputs(len(lens), tq, hq, hkv, dk, dv, lens, dtype=dtype, device=device,
                                       block_size=block_size, cache_layout="transposed")
    if block_size > 1:  # (with one row per block both orders are the same memory: the kernel takes all heads)
        assert kc.stride(1) == dk and vc.stride(1) == dv
    check_kvcache(q, kc, vc, sl, bt, causal=True)
    check_kvcache(q, kc, vc, sl, bt, causal=False, window_left=33, softcap=8.0)
    pad = torch.tensor([min(3, n) for n in lens], dtype=torch.int32, device=device)
    out, lse = attn_ops.attention_with_kvcache(q, kc, vc, sl, block_table=bt, cache_leftpad=pad)
    r_out, r_lse = attention_with_kvcache_serving_ref(q, kc, vc, sl, block_table=bt, cache_leftpad=pad)
    s_out, s_lse = same_dtype_ref(attention_with_kvcache_serving_ref, q, kc, vc, sl, block_table=bt,
                                  cache_leftpad=pad, compute_dtype=dtype)
    assert_close_to_ref(out, r_out, s_out, name="out")
    assert_close_to_ref(lse, r_lse, s_lse, name="lse")


# --------------------------------------------------------------------------------------------------
# Sweeps (float32 + bfloat16)
# --------------------------------------------------------------------------------------------------
LAYOUT_IDS = ["contig", "paged1", "paged16", "paged64"]
BLOCK = {"contig": None, "paged1": 1, "paged16": 16, "paged64": 64}
WINDOWS = {"nowin": (-1, -1), "wl16": (16, -1), "wl5_wr3": (5, 3), "wl0_wr0": (0, 0)}


@pytest.mark.parametrize("window", list(WINDOWS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("tq", [1, 4])
@pytest.mark.parametrize("layout", LAYOUT_IDS)
@pytest.mark.parametrize("dtype", F32_BF16, ids=dtype_id)
def test_kvcache_masks(dtype, layout, tq, causal, window, device):
    # lengths around the block sizes, a row of length 1 and one empty row
    lens = [0, 1, 15, 16, 17, 63, 64, 65, 130]
    q, kc, vc, sl, bt = kvcache_inputs(len(lens), tq, 4, 2, 32, 32, lens, dtype=dtype,
                                       device=device, block_size=BLOCK[layout])
    wl, wr = WINDOWS[window]
    check_kvcache(q, kc, vc, sl, bt, causal=causal, window_left=wl, window_right=wr)


@pytest.mark.parametrize("hq,hkv", [(8, 1), (8, 2), (8, 8), (6, 3), (3, 1)])
@pytest.mark.parametrize("layout", ["contig", "paged16"])
@pytest.mark.parametrize("tq", [1, 4])
@pytest.mark.parametrize("dtype", F32_BF16, ids=dtype_id)
def test_kvcache_heads(dtype, tq, layout, hq, hkv, device):
    lens = [50, 3, 77]
    q, kc, vc, sl, bt = kvcache_inputs(3, tq, hq, hkv, 64, 64, lens, dtype=dtype, device=device,
                                       block_size=BLOCK[layout])
    check_kvcache(q, kc, vc, sl, bt)


@pytest.mark.parametrize("scale", [None, 0.05, -0.3])
@pytest.mark.parametrize("softcap", [1.0, 30.0])
@pytest.mark.parametrize("layout", ["contig", "paged16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=dtype_id)
def test_kvcache_softcap_scale(dtype, layout, softcap, scale, device):
    q, kc, vc, sl, bt = kvcache_inputs(2, 4, 4, 2, 64, 64, [29, 70], dtype=dtype, device=device,
                                       block_size=BLOCK[layout])
    check_kvcache(q, kc, vc, sl, bt, softcap=softcap, scale=scale)


@pytest.mark.parametrize("dk,dv", [(16, 16), (128, 128), (256, 256), (192, 128), (576, 512),
                                   (80, 40), (1, 1)])
@pytest.mark.parametrize("layout", ["contig", "paged16"])
def test_kvcache_head_dims(dk, dv, layout, device):
    hkv = 1 if dk == 576 else 2
    q, kc, vc, sl, bt = kvcache_inputs(2, 2, 4, hkv, dk, dv, [40, 17], dtype=torch.float32,
                                       device=device, block_size=BLOCK[layout])
    check_kvcache(q, kc, vc, sl, bt)


@pytest.mark.parametrize("layout", ["contig", "paged16"])
@pytest.mark.parametrize("tq", [1, 4])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_kvcache_long_cache(dtype, tq, layout, device):
    # one row, one KV head, 3000 keys: the kernel must split the keys to use several threads
    q, kc, vc, sl, bt = kvcache_inputs(1, tq, 4, 1, 64, 64, [3000], dtype=dtype, device=device,
                                       block_size=BLOCK[layout], capacity=3008)
    check_kvcache(q, kc, vc, sl, bt)
    check_kvcache(q, kc, vc, sl, bt, window_left=700)


@pytest.mark.parametrize("layout", ["contig", "paged16"])
def test_kvcache_long_and_short_rows(layout, device):
    lens = [2999, 0, 1, 1500]
    q, kc, vc, sl, bt = kvcache_inputs(4, 1, 8, 2, 64, 64, lens, dtype=torch.float32,
                                       device=device, block_size=BLOCK[layout])
    check_kvcache(q, kc, vc, sl, bt)


# --------------------------------------------------------------------------------------------------
# Rows without visible keys
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["contig", "paged1", "paged16"])
@pytest.mark.parametrize("tq", [1, 4])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_kvcache_empty_rows(dtype, tq, layout, device):
    lens = [0, 12, 0]
    q, kc, vc, sl, bt = kvcache_inputs(3, tq, 4, 2, 32, 32, lens, dtype=dtype, device=device,
                                       block_size=BLOCK[layout])
    for causal in (True, False):
        out, lse, _, _ = check_kvcache(q, kc, vc, sl, bt, causal=causal)
        for b in (0, 2):
            assert (out[b] == 0).all()
            assert torch.isneginf(lse[b]).all()
        assert torch.isfinite(lse[1]).all()


@pytest.mark.parametrize("layout", ["contig", "paged16"])
def test_kvcache_all_rows_empty(layout, device):
    q, kc, vc, sl, bt = kvcache_inputs(2, 3, 4, 2, 32, 16, [0, 0], dtype=torch.float32,
                                       device=device, block_size=BLOCK[layout])
    out, lse = attn_ops.attention_with_kvcache(q, kc, vc, sl, block_table=bt)
    assert tuple(out.shape) == (2, 3, 4, 16) and (out == 0).all()
    assert tuple(lse.shape) == (2, 4, 3) and torch.isneginf(lse).all()


@pytest.mark.parametrize("layout", ["contig", "paged16"])
def test_kvcache_cache_shorter_than_tq(layout, device):
    # cache_seqlens < Tq: the first queries sit before position 0 and (causal) see no key
    q, kc, vc, sl, bt = kvcache_inputs(2, 4, 4, 2, 32, 32, [2, 4], dtype=torch.float32,
                                       device=device, block_size=BLOCK[layout])
    out, lse, _, r_lse = check_kvcache(q, kc, vc, sl, bt, causal=True)
    assert (out[0, :2] == 0).all() and torch.isneginf(lse[0, :, :2]).all()
    assert torch.isfinite(lse[0, :, 2:]).all() and torch.isfinite(lse[1]).all()
    check_kvcache(q, kc, vc, sl, bt, causal=False, window_left=0, window_right=0)


# --------------------------------------------------------------------------------------------------
# Paged == contiguous; == attention on the dense prefix
# --------------------------------------------------------------------------------------------------
TIGHT = {torch.float32: 1e-5, torch.float64: 1e-10, torch.bfloat16: 1e-2, torch.float16: 2e-3}


@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("tq", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
def test_paged_equals_contiguous(dtype, tq, block_size, device):
    lens = [0, 1, 17, 64, 200]
    cap = 256
    q, kc, vc, sl, _ = kvcache_inputs(len(lens), tq, 8, 2, 64, 64, lens, dtype=dtype,
                                      device=device, capacity=cap)
    kp, vp, bt, _ = paged_from_dense(kc, vc, block_size)
    assert (bt.reshape(-1)[:-1] + 1 != bt.reshape(-1)[1:]).any(), "block table is not shuffled"
    for kw in (dict(), dict(causal=False), dict(window_left=9, softcap=5.0)):
        c_out, c_lse, _, _ = check_kvcache(q, kc, vc, sl, **kw)
        p_out, p_lse, _, _ = check_kvcache(q, kp, vp, sl, bt, **kw)
        tol = TIGHT[dtype]
        torch.testing.assert_close(p_out, c_out, rtol=tol, atol=tol)
        torch.testing.assert_close(p_lse, c_lse, rtol=tol, atol=tol)


@pytest.mark.parametrize("kw", [dict(causal=True), dict(causal=False),
                                dict(causal=True, window_left=7),
                                dict(causal=False, window_left=3, window_right=2),
                                dict(causal=True, softcap=4.0, scale=0.3)],
                         ids=["causal", "full", "causal_wl7", "wl3_wr2", "softcap_scale"])
@pytest.mark.parametrize("layout", ["contig", "paged16"])
@pytest.mark.parametrize("tq", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
def test_equals_attention_on_dense_prefix(dtype, tq, layout, kw, device):
    lens = [0, 3, 33, 100]
    q, kc, vc, sl, bt = kvcache_inputs(len(lens), tq, 8, 2, 64, 64, lens, dtype=dtype,
                                       device=device, block_size=BLOCK[layout])
    out, lse, _, _ = check_kvcache(q, kc, vc, sl, bt, **kw)
    tol = TIGHT[dtype]
    for b, L in enumerate(lens):
        k = gather_cache_row(kc, b, L, bt).unsqueeze(0)
        v = gather_cache_row(vc, b, L, bt).unsqueeze(0)
        a_out, a_lse = attn_ops.attention(q[b:b + 1], k, v, **kw)
        torch.testing.assert_close(out[b:b + 1], a_out, rtol=tol, atol=tol, msg=f"row {b}")
        torch.testing.assert_close(lse[b:b + 1], a_lse, rtol=tol, atol=tol, msg=f"row {b}")


# --------------------------------------------------------------------------------------------------
# Block tables, layouts, API paths
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("junk", [-1, 10 ** 6, 2 ** 31 - 1])
def test_unused_block_table_entries_are_ignored(junk, device):
    # only the entries j < ceil(cache_seqlens[b] / block_size) are read (and range-checked)
    lens = [0, 17, 32, 5]
    q, kc, vc, sl, bt = kvcache_inputs(4, 1, 4, 2, 32, 32, lens, dtype=torch.float32,
                                       device=device, block_size=16, capacity=64)
    ref = attn_ops.attention_with_kvcache(q, kc, vc, sl, block_table=bt)
    bt2 = bt.clone()
    for b, L in enumerate(lens):
        bt2[b, -(-L // 16):] = junk
    out, lse, _, _ = check_kvcache(q, kc, vc, sl, bt2)
    torch.testing.assert_close(out, ref[0], rtol=0, atol=0)
    torch.testing.assert_close(lse, ref[1], rtol=0, atol=0)


def test_shared_blocks_between_rows(device):
    # two rows whose tables point at the same blocks (prefix sharing) read the same keys
    q, kc, vc, sl, bt = kvcache_inputs(2, 1, 4, 2, 32, 32, [40, 40], dtype=torch.float32,
                                       device=device, block_size=16, capacity=48)
    bt[1] = bt[0]
    q[1] = q[0]
    out, lse, _, _ = check_kvcache(q, kc, vc, sl, bt)
    torch.testing.assert_close(out[1], out[0], rtol=0, atol=0)


@pytest.mark.parametrize("layouts", [("transposed", "transposed"), ("sliced", "sliced"),
                                     ("expanded", "kv_fused"), ("contiguous", "transposed")],
                         ids=lambda l: "-".join(l))
@pytest.mark.parametrize("layout", ["contig", "paged16"])
@pytest.mark.parametrize("dtype", F32_BF16, ids=dtype_id)
def test_kvcache_strided_views(dtype, layout, layouts, device):
    q, kc, vc, sl, bt = kvcache_inputs(3, 4, 4, 2, 64, 64, [20, 0, 45], dtype=dtype,
                                       device=device, block_size=BLOCK[layout],
                                       q_layout=layouts[0], cache_layout=layouts[1])
    assert not kc.is_contiguous()
    out, lse, _, _ = check_kvcache(q, kc, vc, sl, bt)
    c_out, c_lse = attn_ops.attention_with_kvcache(q.contiguous(), kc.contiguous(),
                                                   vc.contiguous(), sl, block_table=bt)
    tol = TIGHT[dtype]
    torch.testing.assert_close(out, c_out, rtol=tol, atol=tol)
    torch.testing.assert_close(lse, c_lse, rtol=tol, atol=tol)


def test_noncontiguous_seqlens_and_block_table(device):
    q, kc, vc, sl, bt = kvcache_inputs(3, 1, 4, 2, 32, 32, [20, 0, 45], dtype=torch.float32,
                                       device=device, block_size=16)
    sl2 = torch.stack([sl, torch.full_like(sl, 10 ** 6)], 1)[:, 0]
    bt2 = torch.stack([bt, torch.full_like(bt, -5)], 2)[:, :, 0]
    assert not sl2.is_contiguous() and not bt2.is_contiguous()
    check_kvcache(q, kc, vc, sl2, bt2)


def test_causal_overrides_window_right(device):
    q, kc, vc, sl, bt = kvcache_inputs(2, 4, 4, 2, 32, 32, [20, 45], dtype=torch.float32,
                                       device=device)
    a = check_kvcache(q, kc, vc, sl, causal=True, window_left=5, window_right=7)[:2]
    b = attn_ops.attention_with_kvcache(q, kc, vc, sl, causal=False, window_left=5,
                                        window_right=0)
    c = attn_ops.attention_with_kvcache(q, kc, vc, sl, window_left=5)   # causal is the default
    for x in (b, c):
        torch.testing.assert_close(x[0], a[0], rtol=0, atol=0)
        torch.testing.assert_close(x[1], a[1], rtol=0, atol=0)


def test_default_scale(device):
    q, kc, vc, sl, bt = kvcache_inputs(2, 4, 4, 2, 48, 16, [20, 45], dtype=torch.float32,
                                       device=device, block_size=16)
    a = check_kvcache(q, kc, vc, sl, bt)[:2]
    b = attn_ops.attention_with_kvcache(q, kc, vc, sl, block_table=bt, scale=48 ** -0.5)
    torch.testing.assert_close(a[0], b[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(a[1], b[1], rtol=1e-6, atol=1e-6)


def test_torch_ops_path_matches_wrapper(device):
    q, kc, vc, sl, bt = kvcache_inputs(2, 4, 4, 2, 32, 32, [20, 45], dtype=torch.float32,
                                       device=device, block_size=16)
    kw = dict(block_table=bt, causal=True, window_left=7, softcap=4.0, scale=0.2)
    a = attn_ops.attention_with_kvcache(q, kc, vc, sl, **kw)
    b = torch.ops.attn_ops.attention_with_kvcache(q, kc, vc, sl, **kw)
    c = torch.ops.attn_ops.attention_with_kvcache.default(q, kc, vc, sl, **kw)
    for x in (b, c):
        torch.testing.assert_close(x[0], a[0], rtol=0, atol=0)
        torch.testing.assert_close(x[1], a[1], rtol=0, atol=0)


def test_large_logits_no_overflow(device):
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        q, kc, vc, sl, bt = kvcache_inputs(2, 4, 4, 2, 64, 64, [33, 90], dtype=dtype,
                                           device=device, block_size=16)
        check_kvcache(q, kc, vc, sl, bt, scale=4.0)


def test_append_then_attend_matches_attention(device):
    """Decode loop: append each step's token, attend with the advanced lengths; each step's output
    is the float64 reference over the whole dense sequence (bottom-right causal), independent of
    the cache and of attn_ops.attention, which sends Tq = 1 to the same decode kernel."""
    B, Hq, Hkv, D, cap = 2, 4, 2, 32, 24
    kc = torch.randn(B, cap, Hkv, D, device=device)
    vc = torch.randn(B, cap, Hkv, D, device=device)
    sl = torch.zeros(B, dtype=torch.int32, device=device)
    ks, vs = [], []
    for tnew in (6, 1, 1, 3, 1):
        k = torch.randn(B, tnew, Hkv, D, device=device)
        v = torch.randn(B, tnew, Hkv, D, device=device)
        q = torch.randn(B, tnew, Hq, D, device=device)
        attn_ops.kv_cache_append(kc, vc, k, v, sl)
        sl += tnew
        ks.append(k)
        vs.append(v)
        out, lse = attn_ops.attention_with_kvcache(q, kc, vc, sl)
        assert_attention_close_to_ref((out, lse), (q, torch.cat(ks, 1), torch.cat(vs, 1)), causal=True)
