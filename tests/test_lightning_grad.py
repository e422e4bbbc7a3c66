"""Gradients of lightning_attention (C++ autograd through lightning_attention_backward): gradcheck in float64
on small shapes (several blocks, a partial block, GQA, varlen with an empty sequence, initial state), and a
comparison against autograd through the float64 recurrence on a larger float32 case."""

import pytest
import torch

import attn_ops
from lightning_reference import minimax_slopes, recurrence


def make(shape, dtype=torch.float64):
    return (torch.randn(shape, dtype=torch.float64) * 0.5).to(dtype).requires_grad_()


@pytest.mark.parametrize("Hk", [1, 2])
@pytest.mark.parametrize("T", [1, 7])
@pytest.mark.parametrize("slope_kind", ["zero", "minimax"])
def test_gradcheck_dense(Hk, T, slope_kind):
    B, H, Dk, Dv = 2, 2, 3, 4
    q, k, v = make((B, T, H, Dk)), make((B, T, Hk, Dk)), make((B, T, Hk, Dv))
    init = make((B, H, Dk, Dv))
    s = torch.zeros(H) if slope_kind == "zero" else minimax_slopes(H)

    def fn(q, k, v, init):
        return attn_ops.lightning_attention(q, k, v, s, scale=0.6, initial_state=init, block_size=3)

    assert torch.autograd.gradcheck(fn, (q, k, v, init))


def test_gradcheck_varlen_with_empty_sequence_and_no_initial_state():
    cu = torch.tensor([0, 4, 4, 9], dtype=torch.int32)
    q, k, v = make((9, 2, 3)), make((9, 1, 3)), make((9, 1, 2))
    s = minimax_slopes(2)

    def fn(q, k, v):
        return attn_ops.lightning_attention(q, k, v, s, cu_seqlens=cu, block_size=2)

    assert torch.autograd.gradcheck(fn, (q, k, v))


@pytest.mark.parametrize("cu", [[0, 4, 4, 9], [0, 0, 5], [0, 0]], ids=["middle", "first", "only"])
def test_gradcheck_initial_state_through_empty_sequences(cu, device):
    """An empty sequence leaves its state as it was (final = initial, no decay step), so its dinitial_state is
    dfinal_state itself; the backward multiplied every row by the decay."""
    n, rows = cu[-1], len(cu) - 1
    leaves = [make((n, 2, 3)), make((n, 1, 3)), make((n, 1, 2)), make((rows, 2, 3, 2))]
    on_device = [t.detach().to(device).requires_grad_() for t in leaves]
    cu_t, s = torch.tensor(cu, dtype=torch.int32, device=device), minimax_slopes(2).to(device)

    def fn(q, k, v, init):
        return attn_ops.lightning_attention(q, k, v, s, cu_seqlens=cu_t, initial_state=init, block_size=2)

    assert torch.autograd.gradcheck(fn, on_device)


def test_gradcheck_initial_state_of_zero_length_batch(device):
    """Dense q / k / v with T = 0: final_state = initial_state, dinitial_state = dfinal_state."""
    init = make((2, 2, 3, 2)).detach().to(device).requires_grad_()
    q, k, v = (torch.zeros(2, 0, 2, 3, dtype=torch.float64, device=device),
               torch.zeros(2, 0, 1, 3, dtype=torch.float64, device=device),
               torch.zeros(2, 0, 1, 2, dtype=torch.float64, device=device))
    s = minimax_slopes(2).to(device)
    final = attn_ops.lightning_attention(q, k, v, s, initial_state=init)[1]
    dfinal = torch.randn_like(final)
    (grad,) = torch.autograd.grad((final * dfinal).sum(), init)
    torch.testing.assert_close(final, init.detach(), rtol=0, atol=0)
    torch.testing.assert_close(grad, dfinal, rtol=0, atol=0)


def test_gradient_of_final_state_only():
    q, k, v, init = make((1, 6, 2, 3)), make((1, 6, 2, 3)), make((1, 6, 2, 3)), make((1, 2, 3, 3))
    s = minimax_slopes(2)
    assert torch.autograd.gradcheck(
        lambda q, k, v, init: attn_ops.lightning_attention(q, k, v, s, initial_state=init, block_size=4)[1],
        (q, k, v, init))


def test_float32_gradients_match_reference(device):
    B, T, H, Hk, Dk, Dv = 2, 70, 4, 2, 16, 24
    q, k, v = (make((B, T, H, Dk), torch.float32), make((B, T, Hk, Dk), torch.float32),
               make((B, T, Hk, Dv), torch.float32))
    init = make((B, H, Dk, Dv), torch.float32)
    s = minimax_slopes(H)
    on_device = [t.detach().to(device).requires_grad_() for t in (q, k, v, init)]
    out, final = attn_ops.lightning_attention(*on_device[:3], s.to(device), scale=0.25, initial_state=on_device[3],
                                              block_size=16)
    dout, dfinal = torch.randn(out.shape), torch.randn(final.shape)
    grads = [g.cpu() for g in torch.autograd.grad((out * dout.to(device)).sum() + (final * dfinal.to(device)).sum(),
                                                  on_device)]
    ref_out, ref_final = recurrence(q, k, v, s, scale=0.25, initial_state=init)
    ref = torch.autograd.grad((ref_out.double() * dout.double()).sum() + (ref_final * dfinal.double()).sum(),
                              (q, k, v, init))
    for ours, theirs in zip(grads, ref):
        torch.testing.assert_close(ours.double(), theirs.double(), rtol=1e-4, atol=1e-4)


def test_few_streams_split_the_value_columns():
    # One sequence and one head: the CPU kernels split the state's value columns over the threads.
    torch.set_num_threads(max(torch.get_num_threads(), 2))
    q, k, v, init = make((1, 45, 1, 64)), make((1, 45, 1, 64)), make((1, 45, 1, 64)), make((1, 1, 64, 64))
    s = minimax_slopes(1)
    out, final = attn_ops.lightning_attention(q, k, v, s, initial_state=init, block_size=16)
    ref_out, ref_final = recurrence(q, k, v, s, initial_state=init)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final, ref_final, rtol=1e-10, atol=1e-10)
    dout, dfinal = torch.randn_like(out), torch.randn_like(final)
    ours = torch.autograd.grad((out * dout).sum() + (final * dfinal).sum(), (q, k, v, init))
    ref = torch.autograd.grad((ref_out * dout).sum() + (ref_final * dfinal).sum(), (q, k, v, init))
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_gradients_tolerance_rule(dtype, device):
    """The backward's three passes for float16 / bfloat16 inputs (float32 states), against autograd through the
    float64 recurrence, under the rule |ours - ref64| <= 2 |same - ref64| + eps, where `same` is autograd through
    the documented computation (float32 recurrence on the same rounded inputs, gradients rounded once)."""
    from lightning_reference import assert_close_rule
    # eps relative to the largest gradient: about one ulp of the dtype for dq / dk / dv (the larger eps of before
    # let 1% errors pass), float32's for dinitial_state (float32, as the state)
    eps = {torch.float16: 1e-3, torch.bfloat16: 4e-3}[dtype]
    B, T, H, Hk, Dk, Dv = 2, 37, 4, 2, 16, 24
    leaves = [make((B, T, H, Dk), dtype), make((B, T, Hk, Dk), dtype), make((B, T, Hk, Dv), dtype)]
    init = make((B, H, Dk, Dv), torch.float32)
    s = minimax_slopes(H)
    on_device = [t.detach().to(device).requires_grad_() for t in (*leaves, init)]
    out, final = attn_ops.lightning_attention(*on_device[:3], s.to(device), scale=0.25, initial_state=on_device[3],
                                              block_size=16)
    # the gradients the op receives (dout rounded to out's dtype) for every computation
    dout = torch.randn(out.shape, dtype=torch.float64).to(dtype).double()
    dfinal = torch.randn(final.shape, dtype=torch.float64).float().double()
    loss = (out.double() * dout.to(device)).sum() + (final.double() * dfinal.to(device)).sum()
    ours = [g.cpu() for g in torch.autograd.grad(loss, on_device)]
    refs = []
    for compute in (torch.float64, torch.float32):
        ref_leaves = [t.detach().to(compute).requires_grad_() for t in (*leaves, init)]
        r_out, r_final = recurrence(*ref_leaves[:3], s, scale=0.25, initial_state=ref_leaves[3],
                                    compute_dtype=compute, round_out=False)
        grads = torch.autograd.grad((r_out.double() * dout).sum() + (r_final.double() * dfinal).sum(), ref_leaves)
        refs.append([g.to(o.dtype) if compute != torch.float64 else g for g, o in zip(grads, ours)])
    for name, g, r64, same in zip(("dq", "dk", "dv", "dinitial_state"), ours, *refs):
        assert g.dtype == (torch.float32 if name == "dinitial_state" else dtype), name
        assert_close_rule(g, r64, same, (1e-5 if name == "dinitial_state" else eps) * r64.abs().max().item())
