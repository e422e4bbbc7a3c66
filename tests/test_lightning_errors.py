"""Bad-input tests of the lightning attention ops: every error message of docs/lightning_api.md, asserted
whole, and for every rejected decode a check that the state pool is bit-identical to before."""

import pytest
import torch

from error_helpers import expect_error, i32

FWD, BWD, DEC = "lightning_attention", "lightning_attention_backward", "lightning_attention_decode_"
B, T, H, HK, DK, DV = 2, 8, 4, 2, 16, 24


def r(*shape, dtype=torch.float32):
    return torch.randn(shape, dtype=torch.float64).to(dtype)


def good():
    return dict(q=r(B, T, H, DK), k=r(B, T, HK, DK), v=r(B, T, HK, DV), slope=torch.rand(H))


def call_forward(**over):
    a = good()
    a.update(over)
    torch.ops.attn_ops.lightning_attention(a.pop("q"), a.pop("k"), a.pop("v"), a.pop("slope"), **a)


def varlen(**over):
    base = dict(q=r(10, H, DK), k=r(10, HK, DK), v=r(10, HK, DV), cu_seqlens=i32([0, 4, 10]))
    base.update(over)
    return base


FORWARD_CASES = [
    (dict(q=r(B, T, H, DK).to(torch.int32)), "q must be float16, bfloat16, float32 or float64, got int32"),
    (dict(q=r(B, H, DK)), "q must be a 4-D tensor [batch, seqlen, heads, head_dim], "
                          "got a 3-D tensor of shape [2, 4, 16]"),
    (varlen(q=r(1, 10, H, DK)), "q must be a 3-D tensor [total_tokens, heads, head_dim] when cu_seqlens is given, "
                                "got a 4-D tensor of shape [1, 10, 4, 16]"),
    (dict(k=r(B, T, HK, DK, dtype=torch.float64)), "k must have the same dtype as q (float32), got float64"),
    (dict(q=r(B, T, H, 2 * DK)[..., ::2]), "q must have stride 1 in its last dimension, got stride 2"),
    (dict(k=r(B, T, HK, 12)), "k must have shape [2, 8] + [heads_kv, 16] (the tokens and head_dim of q), got "
                              "[2, 8, 2, 12]"),
    (dict(v=r(B, T - 1, HK, DV)), "v must have shape [2, 8, 2] + [head_dim_v] (the tokens and heads of k), got "
                                  "[2, 7, 2, 24]"),
    (dict(k=r(B, T, 3, DK), v=r(B, T, 3, DV)), "the query heads of q (4) must be a positive multiple of the key/value "
                                                "heads of k (3)"),
    (dict(slope=torch.rand(3)), "slope must be a float32 tensor of shape [4] (one decay rate per query head), got "
                                "float32 tensor of shape [3]"),
    (dict(slope=torch.rand(H, dtype=torch.float64)), "slope must be a float32 tensor of shape [4] (one decay rate per "
                                                     "query head), got float64 tensor of shape [4]"),
    (dict(slope=torch.tensor([0.1, -0.5, 0.2, 0.3])), "slope[1] = -0.5 must be finite and >= 0"),
    (dict(slope=torch.tensor([0.1, 0.2, float("nan"), 0.3])), "slope[2] = nan must be finite and >= 0"),
    (dict(slope=torch.tensor([0.1, 0.2, 0.3, float("inf")])), "slope[3] = inf must be finite and >= 0"),
    (dict(initial_state=r(B, H, DV, DK)), "initial_state must be a float32 tensor of shape [2, 4, 16, 24] [batch, "
                                          "heads, head_dim, head_dim_v], got float32 tensor of shape [2, 4, 24, 16]"),
    (dict(q=r(B, T, H, DK, dtype=torch.bfloat16), k=r(B, T, HK, DK, dtype=torch.bfloat16),
          v=r(B, T, HK, DV, dtype=torch.bfloat16), initial_state=r(B, H, DK, DV, dtype=torch.bfloat16)),
     "initial_state must be a float32 tensor of shape [2, 4, 16, 24] [batch, heads, head_dim, head_dim_v], got "
     "bfloat16 tensor of shape [2, 4, 16, 24]"),
    (varlen(cu_seqlens=torch.tensor([0, 4, 10])), "cu_seqlens must be an int32 tensor of shape [batch + 1], got int64 "
                                                  "tensor of shape [3]"),
    (varlen(cu_seqlens=i32([1, 4, 10])), "cu_seqlens must start at 0, got 1"),
    (varlen(cu_seqlens=i32([0, 5, 3, 10])), "cu_seqlens must be non-decreasing, got cu_seqlens[2] = 3 after "
                                            "cu_seqlens[1] = 5"),
    (varlen(cu_seqlens=i32([0, 4, 9])), "cu_seqlens must end at the number of tokens in q (10), got 9"),
    (varlen(max_seqlen=4), "max_seqlen (4) is smaller than the longest sequence in cu_seqlens (6)"),
    (dict(max_seqlen=8), "max_seqlen is only valid with cu_seqlens"),
    (dict(block_size=0), "block_size must be >= 1, got 0"),
    (varlen(max_seqlen=-1), "max_seqlen must be >= 0, got -1"),
    (dict(slope=torch.rand(H, device="meta")), "slope must be on the same device as q (cpu), got meta"),
]


@pytest.mark.parametrize("over,message", FORWARD_CASES, ids=[m[:40] for _, m in FORWARD_CASES])
def test_forward_rejects(over, message):
    expect_error(FWD, message, call=call_forward, anchored=True, **over)


def test_backward_rejects_bad_dout_and_dfinal_state():
    a = good()
    expect_error(BWD, "dout must have the shape of out [2, 8, 4, 24], got [2, 8, 4, 16]", r(B, T, H, DK), None,
                 a["q"], a["k"], a["v"], a["slope"], call=torch.ops.attn_ops.lightning_attention_backward)
    expect_error(BWD, "dfinal_state must be a float32 tensor of shape [2, 4, 16, 24] [batch, heads, head_dim, "
                 "head_dim_v], got float64 tensor of shape [2, 4, 16, 24]", r(B, T, H, DV),
                 r(B, H, DK, DV, dtype=torch.float64), a["q"], a["k"], a["v"], a["slope"],
                 call=torch.ops.attn_ops.lightning_attention_backward)


N = 5


def decode_args():
    return dict(q=r(3, 1, H, DK), k=r(3, 1, HK, DK), v=r(3, 1, HK, DV), slope=torch.rand(H),
                state_indices=i32([3, -1, 0]))


DECODE_CASES = [
    (dict(state=r(N, H, DK, 2 * DV)[..., ::2]), "state must have stride 1 in its last dimension, got stride 2"),
    (dict(state=r(N, H, DV, DK)), "state must be a float32 tensor of shape [5, 4, 16, 24] [num_slots, heads, head_dim, "
                                  "head_dim_v], got float32 tensor of shape [5, 4, 24, 16]"),
    (dict(state=r(N, H * DK, DV)), "state must be a 4-D tensor [num_slots, heads, head_dim, head_dim_v], got a 3-D "
                                   "tensor of shape [5, 64, 24]"),
    (dict(state=r(N, H, DK, DV, dtype=torch.float64)), "state must be a float32 tensor of shape [5, 4, 16, 24] "
     "[num_slots, heads, head_dim, head_dim_v], got float64 tensor of shape [5, 4, 16, 24]"),
    (dict(state_indices=i32([3, 5, 0])), "state_indices[1] = 5 is out of range [-1, 5) of the state pool; -1 skips a "
                                         "row"),
    (dict(state_indices=i32([3, -2, 0])), "state_indices[1] = -2 is out of range [-1, 5) of the state pool; -1 skips a "
                                          "row"),
    (dict(state_indices=i32([3, 1, 3])), "state_indices[2] = 3 repeats state_indices[0]: two rows cannot update one "
                                         "slot"),
    (dict(state_indices=torch.tensor([3, 1, 0])), "state_indices must be an int32 tensor of shape [3], got int64 "
                                                  "tensor of shape [3]"),
    (dict(state_indices=None), "state must have one slot per row (3) when state_indices is not given, got 5 slots"),
    (dict(q=r(3, 0, H, DK), k=r(3, 0, HK, DK), v=r(3, 0, HK, DV)), "q must hold at least one token per row (seqlen >= "
                                                                   "1), got shape [3, 0, 4, 16]"),
    (dict(slope=torch.tensor([0.1, 0.2, -1.0, 0.3])), "slope[2] = -1 must be finite and >= 0"),
    (dict(k=r(3, 1, 3, DK), v=r(3, 1, 3, DV)), "the query heads of q (4) must be a positive multiple of the key/value "
                                               "heads of k (3)"),
]


@pytest.mark.parametrize("over,message", DECODE_CASES, ids=[m[:40] for _, m in DECODE_CASES])
def test_decode_rejects_and_writes_nothing(over, message):
    a = decode_args()
    pool = r(N, H, DK, DV)
    a["state"] = pool
    a.update(over)
    state = a.pop("state")
    expect_error(DEC, message, a.pop("q"), a.pop("k"), a.pop("v"), state, a.pop("slope"), anchored=True,
                 written=(state,), call=torch.ops.attn_ops.lightning_attention_decode_, **a)


def on(device, args):
    return {name: t.to(device) if isinstance(t, torch.Tensor) else t for name, t in args.items()}


# Memory-layout checks, not value checks: they run on every backend (the CUDA kernel writes the state in place).
def test_decode_refuses_expanded_state_and_state_that_requires_grad(device):
    a = on(device, decode_args())
    q, k, v, slope = a["q"], a["k"], a["v"], a["slope"]
    expanded = r(1, H, DK, DV).to(device).expand(N, H, DK, DV)
    expect_error(DEC, "state is written in place but some of its elements share memory (e.g. a dimension of size > 1 "
                 "with stride 0, as from expand()), got shape [5, 4, 16, 24] and strides [0, 384, 24, 1]",
                 q, k, v, expanded, slope, anchored=True, state_indices=a["state_indices"])
    tracked = r(N, H, DK, DV).to(device).requires_grad_()
    # in grad mode the op's autograd kernel refuses it (as for every in-place op), under no_grad the validation
    expect_error(DEC, "state requires grad, but attn_ops.lightning_attention_decode_ is not differentiable: it "
                 "writes in place", q, k, v, tracked, slope, written=(tracked.detach(),),
                 state_indices=a["state_indices"])
    with torch.no_grad():
        expect_error(DEC, "state must not require grad (it is updated in place, which autograd cannot track)",
                     q, k, v, tracked, slope, written=(tracked.detach(),), state_indices=a["state_indices"])


def test_decode_refuses_state_sharing_memory_with_an_input(device):
    a = on(device, decode_args())
    buf = r(N * H * DK * DV + 3 * H * DK).to(device)
    state = buf[: N * H * DK * DV].view(N, H, DK, DV)
    q = buf[N * H * DK * DV - 3 * H * DK:][: 3 * H * DK].view(3, 1, H, DK)  # overlaps the last slot
    expect_error(DEC, "state is written in place and must not share memory with q, but they overlap",
                 q, a["k"], a["v"], state, a["slope"], anchored=True,
                 written=(state,), state_indices=a["state_indices"])
