"""Documented-valid edge inputs give the float64 reference's values (docs/attention_api.md,
docs/kvcache_api.md, docs/mla_api.md): head dims at the limits (1, past 576, 1024, Dqk != Dv), many
heads (64 and 128 query heads, MQA and MHA), stride-0 (expanded) inputs, windows wider than any
sequence. Before these, such inputs were only checked not to crash (or not checked at all), so a kernel
that refused or miscomputed them passed. Every dtype runs (a kernel can be wrong in one dtype only);
shapes are tiny so that the file stays fast.
"""

import pytest
import torch

import attn_ops
from kvcache_reference import kvcache_inputs
from mla_reference import mla_inputs
from reference import assert_attention_close_to_ref, make_bshd
from test_attention_backward import check_backward
from test_attention_with_kvcache import check_kvcache
from test_mla_ops import check_mla

ALL_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
INT64_MAX = 2 ** 63 - 1


def dtype_id(dt):
    return str(dt).replace("torch.", "")


# (Dqk, Dv): the smallest, past 576 (the largest MLA width, where kernels may switch paths), the
# largest, and the two far apart
HEAD_DIMS = {"d1": (1, 1), "d600": (600, 600), "d1024": (1024, 1024), "dqk1024_dv8": (1024, 8),
             "dqk8_dv1024": (8, 1024), "dqk1000_dv577": (1000, 577)}
# (Hq, Hkv): MQA and MHA with many heads
HEADS = {"h64_kv1": (64, 1), "h64_kv64": (64, 64), "h128_kv1": (128, 1), "h128_kv128": (128, 128)}
# (window_left, window_right, causal): wider than any sequence, i.e. unbounded
HUGE_WINDOWS = {"wl2p62_wr2p62": (2 ** 62, 2 ** 62, False), "int64_max": (INT64_MAX, INT64_MAX, False),
                "int32_overflow": (2 ** 31, 2 ** 32 + 1, False), "causal_wl_int64_max": (INT64_MAX, -1, True)}


def window_kw(name):
    wl, wr, causal = HUGE_WINDOWS[name]
    return dict(window_left=wl, window_right=wr, causal=causal)


# --------------------------------------------------------------------------------------------------
# attention: forward against ref64, gradients (through out and lse) against autograd through ref64
# --------------------------------------------------------------------------------------------------
def check_attention(q, k, v, **kw):
    out, lse = attn_ops.attention(q, k, v, **kw)
    assert_attention_close_to_ref((out, lse), (q, k, v), **kw)
    check_backward(q, k, v, **kw)


@pytest.mark.parametrize("dims", list(HEAD_DIMS))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_attention_head_dims(dtype, dims, device):
    dqk, dv = HEAD_DIMS[dims]
    q, k, v = (torch.randn(1, t, h, d, dtype=dtype, device=device)
               for t, h, d in ((3, 2, dqk), (5, 1, dqk), (5, 1, dv)))
    check_attention(q, k, v, causal=True)


@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_attention_many_heads(dtype, heads, device):
    hq, hkv = HEADS[heads]
    q, k, v = (torch.randn(1, t, h, 8, dtype=dtype, device=device)
               for t, h in ((3, hq), (4, hkv), (4, hkv)))
    check_attention(q, k, v, causal=True)


def _expanded(shape, dims, dtype, device):
    """A random tensor of `shape` with stride 0 along `dims` (expand of a size-1 tensor there)."""
    small = [1 if i in dims else n for i, n in enumerate(shape)]
    return torch.randn(small, dtype=dtype, device=device).expand(shape)


# (q, k, v) dims of stride 0 in [B, T, H, D]
STRIDE0 = {"batch": ((0,), (0,), (0,)), "heads_and_seq": ((2,), (1,), (1, 2)),
           "all_but_last": ((0, 1, 2), (0, 1, 2), (0, 1, 2))}


@pytest.mark.parametrize("where", list(STRIDE0))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_attention_stride0_inputs(dtype, where, device):
    dq, dk, dv = STRIDE0[where]
    q = _expanded((2, 5, 4, 16), dq, dtype, device)
    k = _expanded((2, 7, 2, 16), dk, dtype, device)
    v = _expanded((2, 7, 2, 8), dv, dtype, device)
    assert 0 in q.stride() and 0 in k.stride() and 0 in v.stride()
    check_attention(q, k, v, causal=True)


@pytest.mark.parametrize("window", list(HUGE_WINDOWS))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_attention_huge_windows(dtype, window, device):
    q, k, v = (make_bshd(2, t, h, 16, dtype=dtype, device=device) for t, h in ((7, 4), (9, 2), (9, 2)))
    check_attention(q, k, v, **window_kw(window))


# --------------------------------------------------------------------------------------------------
# attention_with_kvcache: decode (Tq = 1) and Tq > 1, contiguous and paged caches
# --------------------------------------------------------------------------------------------------
KV_LAYOUTS = {"contig": None, "paged16": 16}
LENS = [9, 1, 0]


def kv_inputs(tq, hq, hkv, dk, dv, layout, dtype, device, lens=LENS):
    return kvcache_inputs(len(lens), tq, hq, hkv, dk, dv, lens, dtype=dtype, device=device,
                          block_size=KV_LAYOUTS[layout])


@pytest.mark.parametrize("layout", list(KV_LAYOUTS))
@pytest.mark.parametrize("tq", [1, 3])
@pytest.mark.parametrize("dims", list(HEAD_DIMS))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_kvcache_head_dims(dtype, dims, tq, layout, device):
    dk, dv = HEAD_DIMS[dims]
    check_kvcache(*kv_inputs(tq, 2, 1, dk, dv, layout, dtype, device))


@pytest.mark.parametrize("layout", list(KV_LAYOUTS))
@pytest.mark.parametrize("tq", [1, 3])
@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_kvcache_many_heads(dtype, heads, tq, layout, device):
    hq, hkv = HEADS[heads]
    check_kvcache(*kv_inputs(tq, hq, hkv, 8, 8, layout, dtype, device))


@pytest.mark.parametrize("tq", [1, 3])
@pytest.mark.parametrize("where", ["q_batch", "q_heads", "caches_batch", "all"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_kvcache_stride0_inputs(dtype, where, tq, device):
    """Expanded q (batch or heads) and caches expanded over the batch (every row reads one cache row)."""
    B, cap, lens = 3, 12, [9, 4, 12]
    q = torch.randn(B, tq, 4, 16, dtype=dtype, device=device)
    kc = torch.randn(B, cap, 2, 16, dtype=dtype, device=device)
    vc = torch.randn(B, cap, 2, 8, dtype=dtype, device=device)
    if where in ("q_batch", "all"):
        q = _expanded(q.shape, (0,), dtype, device)
    if where in ("q_heads", "all"):
        q = _expanded(q.shape, (2,), dtype, device) if where == "q_heads" else _expanded(q.shape, (0, 2), dtype, device)
    if where in ("caches_batch", "all"):
        kc, vc = _expanded(kc.shape, (0,), dtype, device), _expanded(vc.shape, (0,), dtype, device)
    check_kvcache(q, kc, vc, torch.tensor(lens, dtype=torch.int32, device=device))


@pytest.mark.parametrize("layout", list(KV_LAYOUTS))
@pytest.mark.parametrize("tq", [1, 3])
@pytest.mark.parametrize("window", list(HUGE_WINDOWS))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_kvcache_huge_windows(dtype, window, tq, layout, device):
    check_kvcache(*kv_inputs(tq, 4, 2, 16, 16, layout, dtype, device), **window_kw(window))


# --------------------------------------------------------------------------------------------------
# mla_decode: d_c + d_rope at the limits, many heads, stride-0 inputs
# --------------------------------------------------------------------------------------------------
# (d_c, d_rope): d_c >= 1 and d_c + d_rope <= 1024 (docs/mla_api.md)
MLA_DIMS = {"dc1_dr0": (1, 0), "dc1_dr1": (1, 1), "dc513_dr64": (513, 64), "dc960_dr64": (960, 64),
            "dc1024_dr0": (1024, 0), "dc8_dr1016": (8, 1016)}


def mla_check(ql, qr, cache, sl, bt=None):
    check_mla(ql, qr, cache, sl, bt, scale=(ql.shape[-1] + qr.shape[-1]) ** -0.5)


@pytest.mark.parametrize("layout", list(KV_LAYOUTS))
@pytest.mark.parametrize("tq", [1, 3])
@pytest.mark.parametrize("dims", list(MLA_DIMS))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_mla_dims(dtype, dims, tq, layout, device):
    d_c, d_rope = MLA_DIMS[dims]
    ql, qr, cache, sl, bt, _ = mla_inputs(len(LENS), tq, 2, d_c, d_rope, LENS, dtype=dtype, device=device,
                                          block_size=KV_LAYOUTS[layout])
    mla_check(ql, qr, cache, sl, bt)


@pytest.mark.parametrize("layout", list(KV_LAYOUTS))
@pytest.mark.parametrize("tq", [1, 3])
@pytest.mark.parametrize("heads", [64, 128])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_mla_many_heads(dtype, heads, tq, layout, device):
    ql, qr, cache, sl, bt, _ = mla_inputs(len(LENS), tq, heads, 32, 16, LENS, dtype=dtype, device=device,
                                          block_size=KV_LAYOUTS[layout])
    mla_check(ql, qr, cache, sl, bt)


@pytest.mark.parametrize("tq", [1, 3])
@pytest.mark.parametrize("where", ["q_batch", "q_heads", "cache_batch"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_mla_stride0_inputs(dtype, where, tq, device):
    B, H, d_c, d_rope, cap, lens = 3, 4, 32, 16, 12, [9, 4, 12]
    dims = {"q_batch": (0,), "q_heads": (2,), "cache_batch": ()}[where]
    ql = _expanded((B, tq, H, d_c), dims, dtype, device)
    qr = _expanded((B, tq, H, d_rope), dims, dtype, device)
    cache = _expanded((B, cap, d_c + d_rope), (0,) if where == "cache_batch" else (), dtype, device)
    mla_check(ql, qr, cache, torch.tensor(lens, dtype=torch.int32, device=device))
