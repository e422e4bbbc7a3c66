"""Backward tests of attn_ops.attention / attn_ops.attention_backward.

- gradcheck in float64 on small shapes (through out and through lse, i.e. dlse);
- gradients against autograd through the reference (ref64), with the tolerance rule and the
  same-dtype reference gradients, for larger shapes in every dtype;
- attention_backward called directly (with and without dlse) against autograd;
- rows with no visible key give zero gradients and never NaN.
"""

import pytest
import torch
from torch.autograd import gradcheck

import attn_ops
from reference import (accumulation_dtype, assert_close_to_ref, attention_ref, dense_inputs, ref_kwargs,
                       varlen_inputs, visible_mask)

ALL_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
F32_BF16 = [torch.float32, torch.bfloat16]


def dtype_id(dt):
    return str(dt).replace("torch.", "")


def lse_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32




def leaf(t, dtype=None):
    """A leaf copy requiring grad; keeps the strides of `t` when the dtype is unchanged."""
    x = t.detach() if dtype is None or dtype == t.dtype else t.detach().to(dtype)
    return x.requires_grad_()


def op_grads(q, k, v, dout, dlse, **kw):
    qs, ks, vs = leaf(q), leaf(k), leaf(v)
    out, lse = attn_ops.attention(qs, ks, vs, **kw)
    outs, gos = (out, lse), (dout, dlse)
    if dlse is None:
        outs, gos = (out,), (dout,)
    elif dout is None:
        outs, gos = (lse,), (dlse,)
    return torch.autograd.grad(outs, (qs, ks, vs), gos)


def ref_grads(q, k, v, dout, dlse, compute_dtype, **kw):
    qs, ks, vs = leaf(q, compute_dtype), leaf(k, compute_dtype), leaf(v, compute_dtype)
    out, lse = attention_ref(qs, ks, vs, compute_dtype=compute_dtype, **ref_kwargs(kw))
    outs, gos = [], []
    if dout is not None:
        outs.append(out)
        gos.append(dout.to(compute_dtype))
    if dlse is not None:
        outs.append(lse)
        gos.append(dlse.to(compute_dtype))
    return torch.autograd.grad(outs, (qs, ks, vs), gos, allow_unused=True)


def same_dtype_grads(q, k, v, dout, dlse, **kw):
    """The baseline of the tolerance rule for gradients: for 16-bit inputs, the gradients computed in float32 from
    the same (rounded) inputs and rounded to the dtype once, which is what the kernels do (float32 accumulation);
    autograd through the reference in bfloat16 errs by 1-3% of the largest gradient, which let 3% errors pass."""
    grads = ref_grads(q, k, v, dout, dlse, accumulation_dtype(q.dtype), **kw)
    return tuple(None if g is None else g.to(q.dtype) for g in grads)


def out_lse_shapes(q, v, varlen):
    if varlen:
        return (q.shape[0], q.shape[1], v.shape[-1]), (q.shape[1], q.shape[0])
    return (q.shape[0], q.shape[1], q.shape[2], v.shape[-1]), (q.shape[0], q.shape[2], q.shape[1])


def check_backward(q, k, v, with_dout=True, with_dlse=True, **kw):
    varlen = kw.get("cu_seqlens_q") is not None
    out_shape, lse_shape = out_lse_shapes(q, v, varlen)
    dout = torch.randn(out_shape, dtype=q.dtype, device=q.device) if with_dout else None
    dlse = (torch.randn(lse_shape, dtype=lse_dtype(q.dtype), device=q.device)
            if with_dlse else None)
    ours = op_grads(q, k, v, dout, dlse, **kw)
    r64 = ref_grads(q, k, v, dout, dlse, torch.float64, **kw)
    same = same_dtype_grads(q, k, v, dout, dlse, **kw)
    errs = {}
    for name, g, r, s, x in zip(("dq", "dk", "dv"), ours, r64, same, (q, k, v)):
        assert g is not None
        assert g.shape == x.shape and g.dtype == x.dtype and g.device == x.device
        r = torch.zeros_like(x, dtype=torch.float64) if r is None else r
        s = torch.zeros_like(x) if s is None else s
        errs[name] = assert_close_to_ref(g, r, s, name=name, rounded_intermediates=True)
    return ours


# --------------------------------------------------------------------------------------------------
# gradcheck (float64, small shapes)
# --------------------------------------------------------------------------------------------------
def _gc_inputs(dense_shape, device, layouts=("contiguous",) * 3):
    q, k, v = dense_inputs(*dense_shape, torch.float64, device, layouts)
    return leaf(q), leaf(k), leaf(v)


def finite_lse(lse):
    return torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))


def test_gradcheck_gqa_causal_out_and_lse(device):
    q, k, v = _gc_inputs((2, 4, 6, 4, 2, 4, 4), device)
    assert gradcheck(lambda q, k, v: attn_ops.attention(q, k, v, causal=True), (q, k, v))


def test_gradcheck_window_softcap(device):
    q, k, v = _gc_inputs((1, 6, 6, 2, 1, 4, 4), device)
    f = lambda q, k, v: attn_ops.attention(q, k, v, window_left=2, window_right=1,
                                           softcap=1.5, scale=0.7)
    assert gradcheck(f, (q, k, v))


def test_gradcheck_dqk_ne_dv(device):
    q, k, v = _gc_inputs((1, 3, 5, 2, 1, 6, 3), device)
    assert gradcheck(lambda q, k, v: attn_ops.attention(q, k, v), (q, k, v))


def test_gradcheck_transposed_views(device):
    q, k, v = _gc_inputs((1, 4, 5, 2, 2, 4, 3), device, ("transposed", "sliced", "transposed"))
    assert not q.is_contiguous() and not k.is_contiguous()
    assert gradcheck(lambda q, k, v: attn_ops.attention(q, k, v, causal=True), (q, k, v))


def test_gradcheck_varlen_empty_sequence(device):
    lens_q, lens_k = [3, 0, 4, 2], [4, 2, 0, 5]   # seq 1: Tq 0; seq 2: Tk 0 (rows see no key)
    q, k, v, cq, ck = varlen_inputs(lens_q, lens_k, 2, 1, 4, 3, torch.float64, device)
    q, k, v = leaf(q), leaf(k), leaf(v)

    def f(q, k, v):
        out, lse = attn_ops.attention(q, k, v, causal=True, cu_seqlens_q=cq, cu_seqlens_k=ck)
        return out, finite_lse(lse)

    assert gradcheck(f, (q, k, v))


def test_gradcheck_rows_without_keys(device):
    q, k, v = _gc_inputs((1, 5, 3, 2, 1, 4, 4), device)   # causal, Tq > Tk: rows 0, 1 see no key

    def f(q, k, v):
        out, lse = attn_ops.attention(q, k, v, causal=True)
        return out, finite_lse(lse)

    assert gradcheck(f, (q, k, v))


def test_gradcheck_weighted_out_plus_lse(device):
    q, k, v = _gc_inputs((2, 5, 7, 4, 1, 4, 5), device)
    wo = torch.randn(2, 5, 4, 5, dtype=torch.float64, device=device)
    wl = torch.randn(2, 4, 5, dtype=torch.float64, device=device)

    def f(q, k, v):
        out, lse = attn_ops.attention(q, k, v, window_left=3, softcap=2.0)
        return (out * wo).sum() + (lse * wl).sum()

    assert gradcheck(f, (q, k, v))


def test_gradcheck_lse_only(device):
    q, k, v = _gc_inputs((1, 4, 6, 2, 2, 4, 4), device)
    assert gradcheck(lambda q, k, v: attn_ops.attention(q, k, v, causal=True)[1], (q, k, v))


# --------------------------------------------------------------------------------------------------
# Gradients against the reference, every dtype
# --------------------------------------------------------------------------------------------------
# name: (B, Tq, Tk, Hq, Hkv, Dqk, Dv, layouts, kwargs, with_dlse)
CASES = {
    "gqa_causal_dlse": (2, 65, 65, 8, 2, 64, 64, None, dict(causal=True), True),
    "mqa_causal_tq_lt_tk": (1, 33, 130, 4, 1, 128, 128, None, dict(causal=True), False),
    "mha_tq_gt_tk": (1, 70, 33, 4, 4, 32, 32, None, {}, True),
    "window_softcap_dlse": (1, 100, 100, 4, 2, 32, 32, None,
                            dict(window_left=16, window_right=4, softcap=5.0), True),
    "dqk192_dv128_causal": (1, 40, 50, 4, 2, 192, 128, None, dict(causal=True), False),
    "views": (2, 63, 65, 4, 2, 64, 64, ("transposed", "sliced", "transposed"),
              dict(causal=True, scale=0.2), True),
    "masked_rows_dlse": (2, 20, 8, 4, 2, 32, 32, None, dict(causal=True), True),
    "decode": (2, 1, 130, 8, 1, 64, 64, None, {}, True),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_backward_dtypes(case, dtype, device):
    B, Tq, Tk, Hq, Hkv, Dqk, Dv, layouts, kw, with_dlse = CASES[case]
    q, k, v = dense_inputs(B, Tq, Tk, Hq, Hkv, Dqk, Dv, dtype, device,
                           layouts or ("contiguous",) * 3)
    check_backward(q, k, v, with_dlse=with_dlse, **kw)


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_backward_varlen_dtypes(dtype, layout, device):
    lens_q, lens_k = [7, 0, 65, 3, 20], [9, 4, 65, 0, 13]
    q, k, v, cq, ck = varlen_inputs(lens_q, lens_k, 4, 2, 64, 64, dtype, device, layout)
    check_backward(q, k, v, causal=True, cu_seqlens_q=cq, cu_seqlens_k=ck)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("tq,tk", [(1, 1), (1, 65), (7, 63), (63, 7), (65, 130), (130, 65),
                                   (0, 5), (5, 0)])
@pytest.mark.parametrize("dtype", F32_BF16, ids=dtype_id)
def test_backward_seqlens(dtype, tq, tk, causal, device):
    q, k, v = dense_inputs(2, tq, tk, 4, 2, 32, 32, dtype, device)
    check_backward(q, k, v, causal=causal)


@pytest.mark.parametrize("hq,hkv", [(4, 1), (4, 2), (4, 4), (8, 2), (6, 3)])
@pytest.mark.parametrize("dtype", F32_BF16, ids=dtype_id)
def test_backward_heads(dtype, hq, hkv, device):
    q, k, v = dense_inputs(2, 40, 70, hq, hkv, 64, 64, dtype, device)
    check_backward(q, k, v, causal=True)


@pytest.mark.parametrize("dqk,dv", [(32, 32), (128, 128), (256, 256), (17, 9)])
@pytest.mark.parametrize("dtype", F32_BF16, ids=dtype_id)
def test_backward_head_dims(dtype, dqk, dv, device):
    q, k, v = dense_inputs(1, 33, 65, 4, 2, dqk, dv, dtype, device)
    check_backward(q, k, v, causal=True)


@pytest.mark.parametrize("wl,wr", [(16, -1), (-1, 8), (0, 0), (8, 4)])
@pytest.mark.parametrize("dtype", F32_BF16, ids=dtype_id)
def test_backward_windows(dtype, wl, wr, device):
    q, k, v = dense_inputs(1, 70, 90, 4, 2, 32, 32, dtype, device)
    check_backward(q, k, v, window_left=wl, window_right=wr, softcap=8.0)


def test_backward_lse_only(device):
    q, k, v = dense_inputs(2, 30, 40, 4, 2, 32, 32, torch.float32, device)
    check_backward(q, k, v, with_dout=False, with_dlse=True, causal=True)


def test_backward_sum_loss_expanded_grads(device):
    # out.sum() / lse.sum() send zero-stride (expanded) gradients into the op's backward.
    q, k, v = dense_inputs(2, 17, 23, 4, 2, 32, 16, torch.float32, device)
    qs, ks, vs = leaf(q), leaf(k), leaf(v)
    out, lse = attn_ops.attention(qs, ks, vs, causal=True)
    (out.sum() + lse.sum()).backward()
    dout, dlse = torch.ones_like(out), torch.ones_like(lse)
    r64 = ref_grads(q, k, v, dout, dlse, torch.float64, causal=True)
    same = ref_grads(q, k, v, dout, dlse, torch.float32, causal=True)
    for name, x, r, s in zip(("dq", "dk", "dv"), (qs, ks, vs), r64, same):
        assert_close_to_ref(x.grad, r, s, name=name)


def test_mqa_dk_dv_summed_over_group(device):
    # MQA gradients equal the sums over heads of the MHA gradients with K/V repeated.
    q, k, v = dense_inputs(1, 20, 25, 4, 1, 32, 32, torch.float64, device)
    dout = torch.randn(1, 20, 4, 32, dtype=torch.float64, device=device)
    dq1, dk1, dv1 = op_grads(q, k, v, dout, None, causal=True)
    dq4, dk4, dv4 = op_grads(q, k.expand(1, 25, 4, 32).contiguous(),
                             v.expand(1, 25, 4, 32).contiguous(), dout, None, causal=True)
    torch.testing.assert_close(dq1, dq4)
    torch.testing.assert_close(dk1, dk4.sum(dim=2, keepdim=True))
    torch.testing.assert_close(dv1, dv4.sum(dim=2, keepdim=True))


# --------------------------------------------------------------------------------------------------
# attention_backward called directly
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("with_dlse", [False, True], ids=["no_dlse", "dlse"])
@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
@pytest.mark.parametrize("dtype", F32_BF16, ids=dtype_id)
def test_attention_backward_direct(dtype, varlen, with_dlse, device):
    if varlen:
        q, k, v, cq, ck = varlen_inputs([5, 0, 33], [9, 3, 20], 4, 2, 32, 16, dtype, device)
        kw = dict(causal=True, window_left=6, cu_seqlens_q=cq, cu_seqlens_k=ck)
    else:
        q, k, v = dense_inputs(2, 33, 40, 4, 2, 32, 16, dtype, device,
                               ("transposed", "contiguous", "sliced"))
        kw = dict(causal=True, window_left=6, softcap=4.0)
    out, lse = attn_ops.attention(q, k, v, **kw)
    dout = torch.randn_like(out)
    dlse = torch.randn_like(lse) if with_dlse else None
    dq, dk, dv = attn_ops.attention_backward(dout, q, k, v, out, lse, dlse=dlse, **kw)
    for g, x in zip((dq, dk, dv), (q, k, v)):
        assert g.shape == x.shape and g.dtype == x.dtype and g.is_contiguous()
    auto = op_grads(q, k, v, dout, dlse, **kw)
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else {}
    for g, a in zip((dq, dk, dv), auto):
        torch.testing.assert_close(g, a, **tol)
    same_op = torch.ops.attn_ops.attention_backward(dout, q, k, v, out, lse, dlse=dlse, **kw)
    for g, a in zip((dq, dk, dv), same_op):
        torch.testing.assert_close(g, a, rtol=0, atol=0)
    r64 = ref_grads(q, k, v, dout, dlse, torch.float64, **kw)
    same = same_dtype_grads(q, k, v, dout, dlse, **kw)
    for name, g, r, s in zip(("dq", "dk", "dv"), (dq, dk, dv), r64, same):
        assert_close_to_ref(g, r, s, name=name, rounded_intermediates=True)


def test_attention_backward_strided_arguments(device):
    # dout / out / lse / dlse with arbitrary strides on the non-last dims give the same gradients.
    q, k, v = dense_inputs(2, 21, 30, 4, 2, 32, 16, torch.float32, device)
    kw = dict(causal=True, window_left=9)
    out, lse = attn_ops.attention(q, k, v, **kw)
    dout = torch.randn(2, 4, 21, 16, device=device).transpose(1, 2)
    dlse = torch.randn(2, 21, 4, device=device).transpose(1, 2)
    base = attn_ops.attention_backward(dout.contiguous(), q, k, v, out, lse,
                                       dlse=dlse.contiguous(), **kw)
    out_t = out.transpose(1, 2).contiguous().transpose(1, 2)
    lse_t = lse.transpose(1, 2).contiguous().transpose(1, 2)
    got = attn_ops.attention_backward(dout, q, k, v, out_t, lse_t, dlse=dlse, **kw)
    for g, b in zip(got, base):
        torch.testing.assert_close(g, b, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------------------
# Rows with no visible key / keys nobody sees: zero gradients, no NaN
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_masked_rows_zero_gradients(dtype, device):
    Tq, Tk = 12, 5
    q, k, v = dense_inputs(2, Tq, Tk, 4, 2, 32, 32, dtype, device)
    out, lse = attn_ops.attention(q, k, v, causal=True)
    masked = (~visible_mask(Tq, Tk, causal=True).any(dim=1)).to(device)
    assert torch.isneginf(lse[:, :, masked]).all()
    dout = torch.randn_like(out)
    dlse = torch.randn_like(lse)   # non-zero dlse on the -inf rows too
    dq, dk, dv = attn_ops.attention_backward(dout, q, k, v, out, lse, dlse=dlse, causal=True)
    for g in (dq, dk, dv):
        assert torch.isfinite(g).all()
    assert (dq[:, masked] == 0).all()
    assert (dq[:, ~masked] != 0).any()
    # the same through autograd
    dq2, dk2, dv2 = op_grads(q, k, v, dout, dlse, causal=True)
    for g in (dq2, dk2, dv2):
        assert torch.isfinite(g).all()
    assert (dq2[:, masked] == 0).all()


def test_keys_never_visible_zero_gradients(device):
    # Tq 3, Tk 10, window 0/0: row i sees only key i + 7, so keys 0..6 get no gradient.
    q, k, v = dense_inputs(1, 3, 10, 4, 2, 32, 32, torch.float32, device)
    dk_dv = op_grads(q, k, v, torch.randn(1, 3, 4, 32, device=device),
                     torch.randn(1, 4, 3, device=device), window_left=0, window_right=0)[1:]
    for g in dk_dv:
        assert (g[:, :7] == 0).all() and (g[:, 7:] != 0).any()


def test_no_keys_gradients(device):
    q, k, v = dense_inputs(2, 6, 0, 4, 2, 32, 16, torch.float32, device)
    dq, dk, dv = op_grads(q, k, v, torch.randn(2, 6, 4, 16, device=device),
                          torch.randn(2, 4, 6, device=device), causal=True)
    assert (dq == 0).all() and dk.shape == k.shape and dv.shape == v.shape


def test_varlen_masked_rows_zero_gradients(device):
    lens_q, lens_k = [6, 4, 3], [2, 0, 3]
    q, k, v, cq, ck = varlen_inputs(lens_q, lens_k, 4, 2, 32, 32, torch.float32, device)
    kw = dict(causal=True, cu_seqlens_q=cq, cu_seqlens_k=ck)
    out, lse = attn_ops.attention(q, k, v, **kw)
    masked = torch.isneginf(lse[0])
    assert masked.sum() == 8
    dq, dk, dv = attn_ops.attention_backward(torch.randn_like(out), q, k, v, out, lse,
                                             dlse=torch.randn_like(lse), **kw)
    for g in (dq, dk, dv):
        assert torch.isfinite(g).all()
    assert (dq[masked] == 0).all()
