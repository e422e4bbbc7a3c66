"""attention forward and backward with more sequences than a CUDA grid's y dimension allows (65535):
a dense batch of 70000 and a varlen call with 70000 sequences. The CUDA row kernels once put the batch
in gridDim.y and failed with "invalid configuration argument"; they now fold it into x. Run on CPU too
(its parallel loops over the batch), and on CUDA when there is a GPU.
"""

import pytest
import torch

import attn_ops
from reference import accumulation_dtype, assert_close_to_ref, attention_ref, cu_seqlens, dense_inputs, same_dtype_ref

B, T, H = 70000, 8, 1

CASES = [pytest.param("cpu", torch.float32, 16, id="cpu-float32-d16")]
if torch.cuda.is_available():
    CASES += [pytest.param("cuda", torch.float32, 16, id="cuda-float32-d16-rows"),
              pytest.param("cuda", torch.bfloat16, 64, id="cuda-bfloat16-d64-mma")]
else:
    CASES += [pytest.param("cuda", torch.float32, 16, id="cuda-float32-d16-rows",
                           marks=pytest.mark.skip(reason="CUDA is not available"))]


def leaves(*ts, dtype=None):
    return [t.detach().to(dtype or t.dtype).requires_grad_() for t in ts]


@pytest.mark.parametrize("device,dtype,D", CASES)
def test_dense_batch_past_grid_y(device, dtype, D):
    q, k, v = dense_inputs(B, T, T, H, H, D, D, dtype, device)
    dout = torch.randn(B, T, H, D, device=device).to(dtype)
    ours = leaves(q, k, v)
    out, lse = attn_ops.attention(*ours, causal=True)
    grads = torch.autograd.grad(out, ours, dout)
    refs = []
    for cdt in (torch.float64, accumulation_dtype(dtype)):  # ref64, then the rule's float32 baseline
        ins = leaves(q, k, v, dtype=cdt)
        r_out, r_lse = attention_ref(*ins, causal=True, compute_dtype=cdt)
        refs.append((r_out, r_lse) + torch.autograd.grad(r_out, ins, dout.to(cdt)))
    base_out = same_dtype_ref(attention_ref, q, k, v, causal=True, compute_dtype=dtype)[0]
    refs[1] = (base_out, refs[1][1]) + tuple(g.to(dtype) for g in refs[1][2:])  # rounded once
    for name, a, r64, same in zip(("out", "lse", "dq", "dk", "dv"), (out, lse) + grads, *refs):
        assert_close_to_ref(a, r64, same, name=name, rounded_intermediates=name.startswith("d"))


@pytest.mark.parametrize("device,dtype,D", CASES)
def test_varlen_sequences_past_grid_y(device, dtype, D):
    # 70000 sequences of 4 tokens: the dense batch [B, 4] is the same problem, so its batched reference
    # is this test's reference (the varlen reference would loop over 70000 sequences in Python).
    n = 4
    q, k, v = dense_inputs(B, n, n, H, H, D, D, dtype, device)
    cu = cu_seqlens([n] * B, device)
    flat = [t.reshape(B * n, H, D) for t in (q, k, v)]
    out, lse = attn_ops.attention(*flat, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                  max_seqlen_q=n, max_seqlen_k=n)
    r_out, r_lse = attention_ref(q, k, v, causal=True)
    s_out, s_lse = same_dtype_ref(attention_ref, q, k, v, causal=True, compute_dtype=dtype)
    as_varlen = lambda o, l: (o.reshape(B * n, H, D), l.permute(1, 0, 2).reshape(H, B * n))
    (r_out, r_lse), (s_out, s_lse) = as_varlen(r_out, r_lse), as_varlen(s_out, s_lse)
    assert_close_to_ref(out, r_out, s_out, name="out")
    assert_close_to_ref(lse, r_lse, s_lse, name="lse")
