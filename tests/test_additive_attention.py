"""torch.ops.attn_ops.additive_attention: values against the float64 reference over edge shapes,
padding, NaN propagation, low-precision tolerance rule, gradients (gradcheck and reference)."""
import pytest
import torch

import attn_ops
from additive_reference import additive_attention_ref, additive_inputs
from reference import accumulation_dtype, assert_close_to_ref

SHAPES = [  # B, Tq, Tk, A, Dv
    (2, 5, 7, 16, 8),
    (1, 1, 1, 3, 5),
    (2, 0, 4, 8, 8),
    (2, 3, 0, 8, 8),
    (1, 9, 130, 9, 3),   # more keys than one block, hidden not a multiple of the vector width
    (3, 17, 4, 33, 1),
]


def on(device, *tensors):
    """The tensors on `device` (None stays None)."""
    return [None if t is None else t.to(device) for t in tensors]


def random_mask(B, Tk, *, hide_row=None):
    mask = torch.rand(B, Tk) < 0.3
    if hide_row is not None and Tk:
        mask[hide_row] = True
    return mask


@pytest.mark.parametrize("B, Tq, Tk, A, Dv", SHAPES)
@pytest.mark.parametrize("masked", [False, True])
def test_forward_float64(B, Tq, Tk, A, Dv, masked, device):
    qp, kp, w, v = additive_inputs(B, Tq, Tk, A, Dv)
    mask = random_mask(B, Tk, hide_row=0) if masked else None
    out, lse, weights = (t.cpu() for t in attn_ops.additive_attention(
        *on(device, qp, kp, w, v), key_padding_mask=on(device, mask)[0], return_weights=True))
    ref_out, ref_lse, ref_weights = additive_attention_ref(qp, kp, w, v, mask)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-12, atol=1e-12)
    if masked and Tq:  # every key of batch row 0 is padded: zeros and -inf, not NaN
        assert (out[0] == 0).all() and torch.isneginf(lse[0]).all() and (weights[0] == 0).all()


def test_without_weights_returns_empty_tensor():
    qp, kp, w, v = additive_inputs(2, 4, 6, 8, 3)
    out, lse, weights = attn_ops.additive_attention(qp, kp, w, v)
    assert weights.shape == (0,) and weights.dtype == qp.dtype
    torch.testing.assert_close(out, additive_attention_ref(qp, kp, w, v)[0], rtol=1e-12, atol=1e-12)


# "near_zero": qp + kp close to 0 with a large w. The exp form's error there is absolute (about epsilon per term)
# while tanh's is relative; before the polynomial near 0, float32 missed the rule by 5-70x.
@pytest.mark.parametrize("regime", ["default", "near_zero"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_low_precision_rule(dtype, regime, device):
    qp, kp, w, v = additive_inputs(2, 33, 150, 40, 24)
    if regime == "near_zero":
        qp, kp, w = qp * 0.005, kp * 0.005, w * 60
    mask = random_mask(2, 150)
    ref_out, ref_lse, ref_weights = additive_attention_ref(qp, kp, w, v, mask)
    low = [t.to(dtype) for t in (qp, kp, w, v)]
    out, lse, weights = (t.cpu() for t in attn_ops.additive_attention(
        *on(device, *low), key_padding_mask=on(device, mask)[0], return_weights=True))
    # the rule's baseline: the reference in float32 (the kernels' accumulation) from the same rounded inputs,
    # rounded once (reference.same_dtype_ref)
    acc = accumulation_dtype(dtype)
    same_out, same_lse, same_weights = additive_attention_ref(*(t.to(acc) for t in low), mask)
    assert out.dtype == dtype and lse.dtype == torch.float32 and weights.dtype == dtype
    assert_close_to_ref(out, ref_out, same_out.to(dtype), name="out")
    assert_close_to_ref(lse, ref_lse, same_lse.to(torch.float32), name="lse")
    assert_close_to_ref(weights, ref_weights, same_weights.to(dtype), name="weights")


def test_strided_inputs():
    qp, kp, w, v = additive_inputs(3, 6, 5, 8, 4)
    qp_t = qp.transpose(0, 1).contiguous().transpose(0, 1)  # [B, Tq, A] with batch stride A
    v_t = v.transpose(1, 2).contiguous().transpose(1, 2)    # last dim not contiguous
    out, lse, _ = attn_ops.additive_attention(qp_t, kp, w, v_t)
    torch.testing.assert_close(out, additive_attention_ref(qp, kp, w, v)[0], rtol=1e-12, atol=1e-12)


def test_nan_propagates_to_its_rows_only():
    qp, kp, w, v = additive_inputs(2, 4, 5, 8, 3)
    qp[1, 2, 3] = float("nan")
    out, lse, _ = attn_ops.additive_attention(qp, kp, w, v)
    assert torch.isnan(out[1, 2]).all() and torch.isnan(lse[1, 2])
    nan_rows = torch.isnan(out).any(-1)
    assert nan_rows.sum() == 1


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("use_lse", [False, True])
def test_gradcheck(masked, use_lse, device):
    qp, kp, w, v = (t.detach().to(device).requires_grad_() for t in additive_inputs(2, 3, 5, 4, 3))
    mask = on(device, random_mask(2, 5, hide_row=1) if masked else None)[0]

    def f(qp, kp, w, v):
        out, lse, _ = attn_ops.additive_attention(qp, kp, w, v, key_padding_mask=mask)
        if not use_lse:
            return out
        return out, torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)

    assert torch.autograd.gradcheck(f, (qp, kp, w, v))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gradients_against_reference(dtype, device):
    B, Tq, Tk, A, Dv = 2, 20, 140, 24, 16
    inputs64 = additive_inputs(B, Tq, Tk, A, Dv, requires_grad=True)
    mask = random_mask(B, Tk)
    dout = torch.randn(B, Tq, Dv, dtype=torch.float64)
    dlse = torch.randn(B, Tq, dtype=torch.float64)

    # the op's own inputs and output gradients (rounded to dtype) for every computation
    dout, dlse = dout.to(dtype).double(), dlse.float().double()

    def grads(fn, inputs):
        out, lse = fn(inputs)[:2]
        loss = (out * dout.to(out)).sum() + (lse * dlse.to(lse)).sum()
        return torch.autograd.grad(loss, inputs)

    def leaves(dt):
        return [t.detach().to(dtype).to(device if dt == dtype else "cpu", dt).requires_grad_() for t in inputs64]

    ref = grads(lambda x: additive_attention_ref(*x, mask), leaves(torch.float64))
    ours = [g.cpu() for g in grads(lambda x: attn_ops.additive_attention(*x, key_padding_mask=on(device, mask)[0]),
                                   leaves(dtype))]
    # baseline: the gradients computed in float32 and rounded once (test_attention_backward.same_dtype_grads)
    same = [g.to(dtype) for g in grads(lambda x: additive_attention_ref(*x, mask), leaves(torch.float32))]
    for name, o, r, s in zip(["dqp", "dkp", "dw", "dv"], ours, ref, same):
        assert o.dtype == dtype
        assert_close_to_ref(o, r, s, name=name)


def test_backward_of_fully_padded_rows_is_zero():
    qp, kp, w, v = additive_inputs(2, 3, 4, 5, 2, requires_grad=True)
    mask = torch.zeros(2, 4, dtype=torch.bool)
    mask[0] = True
    out, _, _ = attn_ops.additive_attention(qp, kp, w, v, key_padding_mask=mask)
    out.sum().backward()
    assert (qp.grad[0] == 0).all() and (kp.grad[0] == 0).all() and (v.grad[0] == 0).all()
    assert not any(torch.isnan(t.grad).any() for t in (qp, kp, w, v))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_large_projections_take_the_tanh_form(dtype):
    """Batch entry 1 has |qp| far beyond exp(2 qp)'s range: it is computed with tanh, entry 0 with the
    exponential form; both match the reference, forward and backward, with no NaN."""
    qp, kp, w, v = additive_inputs(2, 6, 9, 12, 4)
    qp[1] *= 80
    kp[1, :, :6] *= -60
    inputs = [t.to(dtype).requires_grad_() for t in (qp, kp, w, v)]
    out, lse, _ = attn_ops.additive_attention(*inputs)
    ref64 = [t.detach().requires_grad_() for t in (qp, kp, w, v)]
    ref_out, ref_lse, _ = additive_attention_ref(*ref64)
    same = [t.detach().to(dtype).requires_grad_() for t in (qp, kp, w, v)]
    same_out, same_lse, _ = additive_attention_ref(*same)
    assert_close_to_ref(out, ref_out, same_out, name="out")
    assert_close_to_ref(lse, ref_lse, same_lse.to(lse.dtype), name="lse")
    # through out and lse (the lse term reaches dqp / dkp / dw through the tanh form's scores too)
    dout, dlse = torch.randn(2, 6, 4, dtype=torch.float64), torch.randn(2, 6, dtype=torch.float64)

    def loss(o, l):
        return (o * dout.to(o.dtype)).sum() + (l * dlse.to(l.dtype)).sum()

    grads = torch.autograd.grad(loss(out, lse), inputs)
    ref_grads = torch.autograd.grad(loss(ref_out, ref_lse), ref64)
    same_grads = torch.autograd.grad(loss(same_out, same_lse), same)
    for name, g, r, s in zip(["dqp", "dkp", "dw", "dv"], grads, ref_grads, same_grads):
        assert_close_to_ref(g, r, s, name=name)
