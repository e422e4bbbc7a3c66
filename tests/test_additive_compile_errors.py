"""additive_attention: torch.library.opcheck, torch.compile(fullgraph=True, dynamic) of a training step,
and every bad-input message (docs/additive_api.md)."""
import pytest
import torch
from torch.library import opcheck

import attn_ops
from additive_reference import additive_inputs
from error_helpers import expect_error

OPCHECK_CASES = {  # name: (B, Tq, Tk, A, Dv, dtype, masked, return_weights)
    "f32": (2, 5, 7, 16, 8, torch.float32, False, False),
    "f64_mask_weights": (2, 3, 9, 5, 4, torch.float64, True, True),
    "bf16_weights": (1, 4, 3, 8, 8, torch.bfloat16, False, True),
    "f16_empty_keys": (2, 3, 0, 8, 4, torch.float16, False, False),
}


@pytest.mark.parametrize("case", list(OPCHECK_CASES))
def test_opcheck(case, device):
    B, Tq, Tk, A, Dv, dtype, masked, return_weights = OPCHECK_CASES[case]
    args = [t.to(device) for t in additive_inputs(B, Tq, Tk, A, Dv, dtype, requires_grad=dtype == torch.float64)]
    mask = (torch.rand(B, Tk, device=device) < 0.3) if masked else None
    opcheck(torch.ops.attn_ops.additive_attention.default, tuple(args),
            {"key_padding_mask": mask, "return_weights": return_weights})


def test_opcheck_backward(device):
    qp, kp, w, v = [t.to(device) for t in additive_inputs(2, 4, 6, 8, 3)]
    out, lse, _ = attn_ops.additive_attention(qp, kp, w, v)
    dlse = torch.randn_like(lse)
    opcheck(torch.ops.attn_ops.additive_attention_backward.default,
            (torch.randn_like(out), dlse, qp, kp, w, v, out, lse), {})


def test_compile_training_step_fullgraph_dynamic(device):
    def step(qp, kp, w, v, mask):
        out, lse, weights = attn_ops.additive_attention(qp, kp, w, v, key_padding_mask=mask, return_weights=True)
        return (out.square().sum() + lse.clamp(min=-10).sum()), weights

    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for Tq, Tk in [(5, 7), (9, 3)]:
        inputs = [t.to(device) for t in additive_inputs(2, Tq, Tk, 8, 4, torch.float32, requires_grad=True)]
        mask = torch.rand(2, Tk, device=device) < 0.3
        loss, weights = compiled(*inputs, mask)
        grads = torch.autograd.grad(loss, inputs)
        eager_inputs = [t.detach().requires_grad_() for t in inputs]
        eager_loss, eager_weights = step(*eager_inputs, mask)
        eager_grads = torch.autograd.grad(eager_loss, eager_inputs)
        torch.testing.assert_close(loss, eager_loss)
        torch.testing.assert_close(weights, eager_weights)
        for g, e in zip(grads, eager_grads):
            torch.testing.assert_close(g, e)


def good():
    return dict(qp=torch.randn(2, 3, 8), kp=torch.randn(2, 4, 8), w=torch.randn(8), v=torch.randn(2, 4, 5))


BAD = [
    ({"qp": torch.ones(2, 3, 8, dtype=torch.long)}, "qp must be float16, bfloat16, float32 or float64, got int64"),
    ({"qp": torch.randn(3, 8)}, "qp must be a 3-D tensor [batch, query_len, hidden], got a 2-D tensor of shape [3, 8]"),
    ({"kp": torch.randn(2, 4, 8, 1)},
     "kp must be a 3-D tensor [batch, key_len, hidden], got a 4-D tensor of shape [2, 4, 8, 1]"),
    ({"w": torch.randn(1, 8)}, "w must be a 1-D tensor [hidden], got a 2-D tensor of shape [1, 8]"),
    ({"v": torch.randn(2, 4)}, "v must be a 3-D tensor [batch, key_len, value_dim], got a 2-D tensor of shape [2, 4]"),
    ({"kp": torch.randn(2, 4, 8, dtype=torch.float64)}, "kp must have the same dtype as qp (float32), got float64"),
    ({"w": torch.randn(8, dtype=torch.float16)}, "w must have the same dtype as qp (float32), got float16"),
    ({"v": torch.randn(2, 4, 5, dtype=torch.bfloat16)}, "v must have the same dtype as qp (float32), got bfloat16"),
    ({"kp": torch.randn(3, 4, 8)}, "kp must have batch = 2 (as qp), got shape [3, 4, 8]"),
    ({"kp": torch.randn(2, 4, 6)}, "kp must have hidden = 8 (as qp), got shape [2, 4, 6]"),
    ({"w": torch.randn(7)}, "w must have hidden = 8 (as qp), got shape [7]"),
    ({"v": torch.randn(1, 4, 5)}, "v must have batch = 2 (as qp), got shape [1, 4, 5]"),
    ({"v": torch.randn(2, 5, 5)}, "v must have key_len = 4 (as kp), got shape [2, 5, 5]"),
    ({"key_padding_mask": torch.zeros(2, 4)},
     "key_padding_mask must be a bool tensor of shape [2, 4] [batch, key_len], got float32 tensor of shape [2, 4]"),
    ({"key_padding_mask": torch.zeros(2, 3, dtype=torch.bool)},
     "key_padding_mask must be a bool tensor of shape [2, 4] [batch, key_len], got bool tensor of shape [2, 3]"),
    ({"w": torch.randn(8, device="meta")}, "w must be on the same device as qp (cpu), got meta"),
]


@pytest.mark.parametrize("change, message", BAD, ids=[m.split(" ")[0] + str(i) for i, (_, m) in enumerate(BAD)])
def test_bad_inputs(change, message):
    args = {**good(), **change}
    mask = args.pop("key_padding_mask", None)
    expect_error("additive_attention", message, args["qp"], args["kp"], args["w"], args["v"], exact=True,
                 key_padding_mask=mask)


def backward_args():
    qp, kp, w, v = good().values()
    out, lse, _ = attn_ops.additive_attention(qp, kp, w, v)
    return dict(dout=torch.randn_like(out), dlse=None, qp=qp, kp=kp, w=w, v=v, out=out, lse=lse)


BAD_BACKWARD = [
    ({"dout": torch.randn(2, 3, 4)},
     "dout must be a tensor of shape [2, 3, 5] [batch, query_len, value_dim], got shape [2, 3, 4]"),
    ({"out": torch.randn(2, 3, 5, dtype=torch.float64)}, "out must have the same dtype as qp (float32), got float64"),
    ({"lse": torch.randn(2, 3, dtype=torch.float64)},
     "lse must be a float32 tensor of shape [2, 3] [batch, query_len], got float64 tensor of shape [2, 3]"),
    ({"dlse": torch.randn(3, 2)},
     "dlse must be a float32 tensor of shape [2, 3] [batch, query_len], got float32 tensor of shape [3, 2]"),
]


@pytest.mark.parametrize("change, message", BAD_BACKWARD)
def test_bad_backward_inputs(change, message):
    args = {**backward_args(), **change}
    expect_error("additive_attention_backward", message, *args.values(), exact=True,
                 call=torch.ops.attn_ops.additive_attention_backward)
