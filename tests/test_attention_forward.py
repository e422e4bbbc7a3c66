"""Forward tests of attn_ops.attention against the float64 reference (tests/reference.py).

Every comparison uses the tolerance rule max|ours - ref64| <= 2 * max|same_dtype - ref64| + eps on
both outputs (out and lse; lse must be -inf exactly where the reference is -inf).
The full dtype sweep runs on a representative set of cases; the shape sweeps (lengths, heads, head
dims, windows, softcap/scale, layouts, varlen) run in float32 and one low-precision dtype.
"""

import pytest
import torch

import attn_ops
from reference import (assert_close_to_ref, attention_ref, cu_seqlens, dense_inputs, ref_kwargs, same_dtype_ref,
                       varlen_inputs, visible_mask)

ALL_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
F32_BF16 = [torch.float32, torch.bfloat16]
F32_F16 = [torch.float32, torch.float16]


def dtype_id(dt):
    return str(dt).replace("torch.", "")


def expected_shapes(q, v, varlen):
    if varlen:
        return (q.shape[0], q.shape[1], v.shape[-1]), (q.shape[1], q.shape[0])
    return (q.shape[0], q.shape[1], q.shape[2], v.shape[-1]), (q.shape[0], q.shape[2], q.shape[1])


def check_forward(q, k, v, **kw):
    """Run the op, check shapes/dtypes/contiguity and compare with the reference."""
    before = [t.clone() for t in (q, k, v)]
    out, lse = attn_ops.attention(q, k, v, **kw)
    for t, b in zip((q, k, v), before):
        assert torch.equal(t, b), "the op modified an input"
    varlen = kw.get("cu_seqlens_q") is not None
    out_shape, lse_shape = expected_shapes(q, v, varlen)
    assert tuple(out.shape) == out_shape
    assert tuple(lse.shape) == lse_shape
    assert out.dtype == q.dtype
    assert lse.dtype == (torch.float64 if q.dtype == torch.float64 else torch.float32)
    assert out.device == q.device and lse.device == q.device
    assert out.is_contiguous()
    rk = ref_kwargs(kw)
    r_out, r_lse = attention_ref(q, k, v, **rk)
    s_out, s_lse = same_dtype_ref(attention_ref, q, k, v, **rk, compute_dtype=q.dtype)
    assert_close_to_ref(out, r_out, s_out, name="out")
    assert_close_to_ref(lse, r_lse, s_lse, name="lse")
    return out, lse, r_out, r_lse


# --------------------------------------------------------------------------------------------------
# Full dtype sweep on representative cases
# --------------------------------------------------------------------------------------------------
# name: (B, Tq, Tk, Hq, Hkv, Dqk, Dv, layouts, kwargs)
CASES = {
    "mha": (2, 65, 65, 4, 4, 64, 64, None, {}),
    "gqa_causal_tq_lt_tk": (2, 33, 100, 8, 2, 128, 128, None, dict(causal=True)),
    "gqa_tq_gt_tk": (1, 100, 33, 8, 2, 64, 64, None, {}),
    "mqa_window": (2, 130, 130, 4, 1, 64, 64, None, dict(window_left=16, window_right=8)),
    "softcap_scale": (2, 63, 65, 4, 2, 32, 32, None, dict(softcap=5.0, scale=0.3)),
    "dqk192_dv128_causal": (1, 40, 40, 4, 2, 192, 128, None, dict(causal=True)),
    "decode": (3, 1, 257, 8, 2, 128, 128, None, {}),
    "views_causal": (2, 63, 65, 4, 2, 64, 64, ("transposed", "sliced", "transposed"),
                     dict(causal=True)),
    "cross_masked_rows": (2, 10, 4, 4, 2, 32, 32, None, dict(causal=True)),
    "head_dim_256": (1, 20, 30, 2, 1, 256, 256, None, dict(causal=True)),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_forward_dtypes(case, dtype, device):
    B, Tq, Tk, Hq, Hkv, Dqk, Dv, layouts, kw = CASES[case]
    q, k, v = dense_inputs(B, Tq, Tk, Hq, Hkv, Dqk, Dv, dtype, device,
                           layouts or ("contiguous",) * 3)
    check_forward(q, k, v, **kw)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_forward_varlen_dtypes(dtype, causal, device):
    lens_q = [7, 0, 65, 1, 30]
    lens_k = [9, 4, 65, 0, 20]   # Tq_i != Tk_i, an empty q sequence, an empty k sequence
    q, k, v, cq, ck = varlen_inputs(lens_q, lens_k, 4, 2, 64, 64, dtype, device)
    check_forward(q, k, v, causal=causal, cu_seqlens_q=cq, cu_seqlens_k=ck)


# --------------------------------------------------------------------------------------------------
# Shape sweeps (float32 + one low-precision dtype)
# --------------------------------------------------------------------------------------------------
SEQLENS = [(1, 1), (1, 7), (7, 1), (1, 257), (7, 63), (63, 7), (64, 64), (65, 130), (130, 65),
           (128, 63), (257, 257), (0, 5), (5, 0), (0, 0), (1, 0)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("tq,tk", SEQLENS)
@pytest.mark.parametrize("dtype", F32_BF16, ids=dtype_id)
def test_forward_seqlens(dtype, tq, tk, causal, device):
    q, k, v = dense_inputs(2, tq, tk, 4, 2, 64, 64, dtype, device)
    check_forward(q, k, v, causal=causal)


@pytest.mark.parametrize("hq,hkv", [(4, 1), (4, 2), (4, 4), (8, 1), (8, 2), (8, 8), (6, 3), (3, 1)])
@pytest.mark.parametrize("dtype", F32_BF16, ids=dtype_id)
def test_forward_heads(dtype, hq, hkv, device):
    q, k, v = dense_inputs(2, 65, 70, hq, hkv, 64, 64, dtype, device)
    check_forward(q, k, v, causal=True)


@pytest.mark.parametrize("dqk,dv", [(32, 32), (64, 64), (128, 128), (256, 256), (192, 128),
                                    (576, 512), (80, 80), (17, 9), (1, 1)])
@pytest.mark.parametrize("dtype", F32_F16, ids=dtype_id)
def test_forward_head_dims(dtype, dqk, dv, device):
    hkv = 1 if dqk == 576 else 2
    q, k, v = dense_inputs(2, 70, 130, 4, hkv, dqk, dv, dtype, device)
    check_forward(q, k, v, causal=True)


WINDOWS = [(16, -1), (-1, 16), (8, 4), (0, 0), (0, -1), (-1, 0), (200, 3), (3, 200)]


@pytest.mark.parametrize("tq,tk", [(65, 130), (130, 65)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("wl,wr", WINDOWS)
@pytest.mark.parametrize("dtype", F32_BF16, ids=dtype_id)
def test_forward_windows(dtype, wl, wr, causal, tq, tk, device):
    q, k, v = dense_inputs(1, tq, tk, 2, 1, 32, 32, dtype, device)
    check_forward(q, k, v, causal=causal, window_left=wl, window_right=wr)


def test_causal_overrides_window_right(device):
    q, k, v = dense_inputs(1, 40, 50, 4, 2, 32, 32, torch.float32, device)
    a = attn_ops.attention(q, k, v, causal=True, window_left=5, window_right=7)
    b = attn_ops.attention(q, k, v, causal=False, window_left=5, window_right=0)
    c = attn_ops.attention(q, k, v, causal=True, window_left=5)
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)
    torch.testing.assert_close(a[1], b[1], rtol=0, atol=0)
    torch.testing.assert_close(a[0], c[0], rtol=0, atol=0)


@pytest.mark.parametrize("scale", [None, 0.05, 1.0, -0.3, 0.0])
@pytest.mark.parametrize("softcap", [0.0, 1.0, 30.0])
@pytest.mark.parametrize("dtype", F32_F16, ids=dtype_id)
def test_forward_softcap_scale(dtype, softcap, scale, device):
    q, k, v = dense_inputs(2, 63, 65, 4, 2, 64, 64, dtype, device)
    check_forward(q, k, v, causal=True, softcap=softcap, scale=scale)


LAYOUTS = [
    ("transposed", "transposed", "transposed"),
    ("sliced", "sliced", "sliced"),
    ("transposed", "sliced", "contiguous"),
    ("sliced", "transposed", "expanded"),
    ("expanded", "expanded", "expanded"),
]


@pytest.mark.parametrize("layouts", LAYOUTS, ids=lambda l: "-".join(l))
@pytest.mark.parametrize("dtype", F32_BF16, ids=dtype_id)
def test_forward_layouts(dtype, layouts, device):
    q, k, v = dense_inputs(2, 63, 65, 4, 2, 64, 64, dtype, device, layouts)
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    check_forward(q, k, v, causal=True)


def test_forward_views_equal_contiguous(device):
    q, k, v = dense_inputs(2, 63, 65, 4, 2, 64, 64, torch.float32, device,
                           ("transposed", "sliced", "transposed"))
    a = attn_ops.attention(q, k, v, causal=True)
    b = attn_ops.attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=True)
    torch.testing.assert_close(a[0], b[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(a[1], b[1], rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------------------
# varlen
# --------------------------------------------------------------------------------------------------
VARLEN_LENS = {
    "mixed": ([3, 0, 7, 65, 1, 100], [5, 4, 0, 61, 1, 150]),
    "equal": ([33, 33, 33], [33, 33, 33]),
    "q_longer": ([20, 70], [10, 7]),
    "single": ([130], [257]),
    "all_empty": ([0, 0], [0, 0]),
    "empty_k": ([5, 3], [0, 0]),
}


@pytest.mark.parametrize("window", [(-1, -1), (8, 2)], ids=["nowindow", "window8_2"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("lens", list(VARLEN_LENS))
@pytest.mark.parametrize("dtype", F32_BF16, ids=dtype_id)
def test_forward_varlen(dtype, lens, causal, window, device):
    lens_q, lens_k = VARLEN_LENS[lens]
    q, k, v, cq, ck = varlen_inputs(lens_q, lens_k, 4, 2, 64, 64, dtype, device)
    check_forward(q, k, v, causal=causal, window_left=window[0], window_right=window[1],
                  cu_seqlens_q=cq, cu_seqlens_k=ck)


@pytest.mark.parametrize("layout", ["transposed", "sliced"])
@pytest.mark.parametrize("dtype", F32_BF16, ids=dtype_id)
def test_forward_varlen_views(dtype, layout, device):
    lens_q, lens_k = VARLEN_LENS["mixed"]
    q, k, v, cq, ck = varlen_inputs(lens_q, lens_k, 4, 1, 32, 48, dtype, device, layout)
    check_forward(q, k, v, causal=True, softcap=3.0, cu_seqlens_q=cq, cu_seqlens_k=ck)


def test_forward_varlen_max_seqlen(device):
    lens_q, lens_k = [3, 0, 17, 9], [5, 4, 12, 0]
    q, k, v, cq, ck = varlen_inputs(lens_q, lens_k, 4, 2, 32, 32, torch.float32, device)
    base = attn_ops.attention(q, k, v, causal=True, cu_seqlens_q=cq, cu_seqlens_k=ck)
    for mq, mk in [(17, 12), (100, 300)]:  # exact and larger-than-needed bounds
        out, lse, _, _ = check_forward(q, k, v, causal=True, cu_seqlens_q=cq, cu_seqlens_k=ck,
                                       max_seqlen_q=mq, max_seqlen_k=mk)
        torch.testing.assert_close(out, base[0], rtol=0, atol=0)
        torch.testing.assert_close(lse, base[1], rtol=0, atol=0)


def test_forward_varlen_matches_dense(device):
    B, T, S = 3, 37, 45
    q, k, v = dense_inputs(B, T, S, 4, 2, 64, 64, torch.float32, device)
    dense = attn_ops.attention(q, k, v, causal=True, window_left=9)
    var = attn_ops.attention(q.reshape(B * T, 4, 64), k.reshape(B * S, 2, 64),
                             v.reshape(B * S, 2, 64), causal=True, window_left=9,
                             cu_seqlens_q=cu_seqlens([T] * B, device),
                             cu_seqlens_k=cu_seqlens([S] * B, device))
    torch.testing.assert_close(var[0].reshape(B, T, 4, 64), dense[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(var[1].reshape(4, B, T).permute(1, 0, 2), dense[1],
                               rtol=1e-5, atol=1e-5)


def test_forward_varlen_batch_zero(device):
    q, k, v, cq, ck = varlen_inputs([], [], 4, 2, 32, 16, torch.float32, device)
    assert cq.tolist() == [0]
    out, lse = attn_ops.attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck)
    assert tuple(out.shape) == (0, 4, 16) and tuple(lse.shape) == (4, 0)


# --------------------------------------------------------------------------------------------------
# Rows with no visible key, empty batches, the torch.ops path
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_cross_attention_rows_without_keys(dtype, device):
    Tq, Tk = 12, 5
    q, k, v = dense_inputs(2, Tq, Tk, 4, 2, 32, 32, dtype, device)
    out, lse, _, _ = check_forward(q, k, v, causal=True)
    masked = ~visible_mask(Tq, Tk, causal=True).any(dim=1)  # rows 0 .. Tq - Tk - 1
    assert masked.sum() == Tq - Tk
    m = masked.to(device)
    assert (out[:, m] == 0).all()
    assert torch.isneginf(lse[:, :, m]).all()
    assert torch.isfinite(lse[:, :, ~m]).all()
    assert not torch.isnan(out).any()
    # window 0/0 with Tq > Tk: each row sees at most key i + offset
    out, lse, _, _ = check_forward(q, k, v, window_left=0, window_right=0)
    assert (out[:, m] == 0).all() and torch.isneginf(lse[:, :, m]).all()


@pytest.mark.parametrize("causal", [False, True])
def test_no_keys_at_all(causal, device):
    q, k, v = dense_inputs(2, 6, 0, 4, 2, 32, 16, torch.float32, device)
    out, lse = attn_ops.attention(q, k, v, causal=causal)
    assert tuple(out.shape) == (2, 6, 4, 16) and (out == 0).all()
    assert tuple(lse.shape) == (2, 4, 6) and torch.isneginf(lse).all()


def test_varlen_rows_without_keys(device):
    lens_q, lens_k = [6, 4, 3], [2, 0, 3]
    q, k, v, cq, ck = varlen_inputs(lens_q, lens_k, 4, 2, 32, 32, torch.float32, device)
    out, lse, _, r_lse = check_forward(q, k, v, causal=True, cu_seqlens_q=cq, cu_seqlens_k=ck)
    masked = torch.isneginf(r_lse[0]).to(device)
    assert masked.sum() == 4 + 4  # 4 rows of seq 0 (Tq 6 > Tk 2), all of seq 1 (Tk 0)
    assert (out[masked] == 0).all() and torch.isneginf(lse[:, masked]).all()


def test_batch_zero(device):
    q, k, v = dense_inputs(0, 5, 7, 4, 2, 32, 16, torch.float32, device)
    out, lse = attn_ops.attention(q, k, v)
    assert tuple(out.shape) == (0, 5, 4, 16) and tuple(lse.shape) == (0, 4, 5)


def test_torch_ops_path_matches_wrapper(device):
    q, k, v = dense_inputs(2, 20, 30, 4, 2, 32, 32, torch.float32, device)
    kw = dict(causal=True, window_left=7, softcap=4.0, scale=0.2)
    a = attn_ops.attention(q, k, v, **kw)
    b = torch.ops.attn_ops.attention(q, k, v, **kw)
    c = torch.ops.attn_ops.attention.default(q, k, v, **kw)
    for x in (b, c):
        torch.testing.assert_close(x[0], a[0], rtol=0, atol=0)
        torch.testing.assert_close(x[1], a[1], rtol=0, atol=0)


def test_default_scale(device):
    q, k, v = dense_inputs(1, 9, 11, 2, 1, 48, 16, torch.float32, device)
    a = attn_ops.attention(q, k, v)
    b = attn_ops.attention(q, k, v, scale=48 ** -0.5)
    torch.testing.assert_close(a[0], b[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(a[1], b[1], rtol=1e-6, atol=1e-6)


def test_large_logits_no_overflow(device):
    # Large logits (scale 4, D 64) must not overflow: the softmax is max-shifted.
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        q, k, v = dense_inputs(1, 33, 40, 2, 1, 64, 64, dtype, device)
        check_forward(q, k, v, scale=4.0)
