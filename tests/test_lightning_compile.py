"""opcheck on every lightning op, and torch.compile(fullgraph=True, dynamic=True) of the forward, a training
step (no recompile for a second length) and the in-place decode."""

import pytest
import torch

import attn_ops
from lightning_reference import minimax_slopes


def r(*shape, dtype=torch.float32):
    return torch.randn(shape, dtype=dtype) * 0.5


@pytest.mark.parametrize("varlen", [False, True])
def test_opcheck_forward_and_backward(varlen):
    H, Hk, Dk, Dv = 4, 2, 8, 12
    s = minimax_slopes(H)
    if varlen:
        cu = torch.tensor([0, 5, 5, 23], dtype=torch.int32)
        q, k, v = r(23, H, Dk), r(23, Hk, Dk), r(23, Hk, Dv)
        kw = dict(cu_seqlens=cu, initial_state=r(3, H, Dk, Dv), block_size=4)
        out_shape = (23, H, Dv)
        state_shape = (3, H, Dk, Dv)
    else:
        q, k, v = r(2, 19, H, Dk), r(2, 19, Hk, Dk), r(2, 19, Hk, Dv)
        kw = dict(initial_state=r(2, H, Dk, Dv), scale=0.3)
        out_shape = (2, 19, H, Dv)
        state_shape = (2, H, Dk, Dv)
    for t in (q, k, v, kw["initial_state"]):
        t.requires_grad_()
    torch.library.opcheck(torch.ops.attn_ops.lightning_attention.default, (q, k, v, s), kw)
    bkw = {key: val.detach() if isinstance(val, torch.Tensor) else val for key, val in kw.items()}
    torch.library.opcheck(torch.ops.attn_ops.lightning_attention_backward.default,
                          (r(*out_shape), r(*state_shape), q.detach(), k.detach(), v.detach(), s), bkw)


def test_opcheck_decode():
    H, Hk, Dk, Dv = 4, 1, 8, 8
    pool = r(6, H, Dk, Dv)
    args = (r(3, 2, H, Dk), r(3, 2, Hk, Dk), r(3, 2, Hk, Dv), pool, minimax_slopes(H))
    torch.library.opcheck(torch.ops.attn_ops.lightning_attention_decode_.default, args,
                          dict(scale=0.5, state_indices=torch.tensor([4, -1, 0], dtype=torch.int32)))


def test_compile_training_step_fullgraph_dynamic_no_recompile():
    torch._dynamo.reset()
    H, Dk = 2, 8
    s = minimax_slopes(H)
    w = torch.randn(Dk, Dk, requires_grad=True)

    def step(x):
        out, state = attn_ops.lightning_attention(x @ w, x, x, s, block_size=8)
        return out.square().mean() + state.square().mean()

    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    counts = []
    for T in (20, 37):
        x = torch.randn(2, T, H, Dk)
        loss = compiled(x)
        (g,) = torch.autograd.grad(loss, w)
        ref_loss = step(x)
        (ref_g,) = torch.autograd.grad(ref_loss, w)
        torch.testing.assert_close(loss, ref_loss)
        torch.testing.assert_close(g, ref_g)
        counts.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    assert counts[0] == counts[1], f"recompiled for a second length: {counts}"


def test_compile_decode_step_fullgraph_in_place():
    torch._dynamo.reset()
    H, Dk, Dv = 4, 8, 8
    s = minimax_slopes(H)
    idx = torch.tensor([2, 0], dtype=torch.int32)

    def decode(q, k, v, pool):
        return attn_ops.lightning_attention_decode_(q, k, v, pool, s, state_indices=idx) * 2

    compiled = torch.compile(decode, fullgraph=True, dynamic=True)
    pool = r(3, H, Dk, Dv)
    pool_ref = pool.clone()
    for _ in range(3):
        q, k, v = r(2, 1, H, Dk), r(2, 1, H, Dk), r(2, 1, H, Dv)
        torch.testing.assert_close(compiled(q, k, v, pool), decode(q, k, v, pool_ref))
        torch.testing.assert_close(pool, pool_ref)
