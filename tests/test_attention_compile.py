"""torch.library.opcheck on both ops, and torch.compile (fullgraph, dynamic shapes) of functions
and of a GQA module training step: no graph break, no recompile, results equal to eager.
"""

import copy

import pytest
import torch
import torch.nn as nn
from torch.library import opcheck

import attn_ops
from reference import cu_seqlens


def _dense(B, Tq, Tk, Hq, Hkv, D, Dv, dtype, device, requires_grad):
    q = torch.randn(B, Tq, Hq, D, dtype=dtype, device=device, requires_grad=requires_grad)
    k = torch.randn(B, Tk, Hkv, D, dtype=dtype, device=device, requires_grad=requires_grad)
    v = torch.randn(B, Tk, Hkv, Dv, dtype=dtype, device=device, requires_grad=requires_grad)
    return q, k, v


def _varlen(lens_q, lens_k, Hq, Hkv, D, Dv, dtype, device, requires_grad):
    q = torch.randn(sum(lens_q), Hq, D, dtype=dtype, device=device, requires_grad=requires_grad)
    k = torch.randn(sum(lens_k), Hkv, D, dtype=dtype, device=device, requires_grad=requires_grad)
    v = torch.randn(sum(lens_k), Hkv, Dv, dtype=dtype, device=device, requires_grad=requires_grad)
    return q, k, v, dict(cu_seqlens_q=cu_seqlens(lens_q, device),
                         cu_seqlens_k=cu_seqlens(lens_k, device))


def opcheck_inputs(name, device):
    if name == "dense_gqa_grad_f32":
        return _dense(2, 9, 11, 4, 2, 16, 8, torch.float32, device, True), {}
    if name == "causal_window_grad_bf16":
        return (_dense(1, 12, 12, 4, 1, 32, 32, torch.bfloat16, device, True),
                dict(causal=True, window_left=3))
    if name == "softcap_scale_grad_f64":
        return (_dense(2, 7, 10, 2, 2, 8, 8, torch.float64, device, True),
                dict(softcap=2.0, scale=0.5, window_right=2))
    if name == "decode_nograd_f32":
        return _dense(3, 1, 17, 8, 2, 16, 16, torch.float32, device, False), {}
    if name == "varlen_grad_f64":
        q, k, v, cu = _varlen([3, 0, 7], [5, 1, 9], 4, 2, 8, 4, torch.float64, device, True)
        return (q, k, v), dict(causal=True, **cu)
    if name == "varlen_max_seqlen_grad_f32":
        q, k, v, cu = _varlen([4, 6], [6, 9], 2, 1, 16, 16, torch.float32, device, True)
        return (q, k, v), dict(max_seqlen_q=6, max_seqlen_k=9, **cu)
    raise ValueError(name)


OPCHECK_CASES = ["dense_gqa_grad_f32", "causal_window_grad_bf16", "softcap_scale_grad_f64",
                 "decode_nograd_f32", "varlen_grad_f64", "varlen_max_seqlen_grad_f32"]


@pytest.mark.parametrize("case", OPCHECK_CASES)
def test_opcheck_attention(case, device):
    args, kwargs = opcheck_inputs(case, device)
    opcheck(torch.ops.attn_ops.attention.default, args, kwargs)


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
@pytest.mark.parametrize("with_dlse", [False, True], ids=["no_dlse", "dlse"])
def test_opcheck_attention_backward(varlen, with_dlse, device):
    if varlen:
        q, k, v, cu = _varlen([3, 0, 7], [5, 1, 9], 4, 2, 8, 4, torch.float32, device, False)
        kw = dict(causal=True, **cu)
    else:
        q, k, v = _dense(2, 9, 11, 4, 2, 16, 8, torch.float32, device, False)
        kw = dict(causal=True, softcap=3.0)
    out, lse = attn_ops.attention(q, k, v, **kw)
    dout = torch.randn_like(out)
    if with_dlse:
        kw["dlse"] = torch.randn_like(lse)
    opcheck(torch.ops.attn_ops.attention_backward.default, (dout, q, k, v, out, lse), kw)


# --------------------------------------------------------------------------------------------------
# torch.compile
# --------------------------------------------------------------------------------------------------
def attn_fn(q, k, v):
    out, lse = attn_ops.attention(q, k, v, causal=True, window_left=8, softcap=10.0)
    return out * 2.0, lse


def _loss_and_grads(fn, q, k, v, wo, wl):
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out, lse = fn(q, k, v)
    loss = (out * wo).sum() + (lse * wl).sum()
    grads = torch.autograd.grad(loss, (q, k, v))
    return out.detach(), lse.detach(), grads


def test_dynamo_explain_no_graph_break(device):
    q, k, v = _dense(2, 16, 16, 4, 2, 32, 32, torch.float32, device, False)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(attn_fn)(q, k, v)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_compile_fullgraph_dynamic_matches_eager(device):
    torch._dynamo.reset()
    compiled = torch.compile(attn_fn, fullgraph=True, dynamic=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for T, S in [(16, 24), (33, 45), (7, 70)]:   # different lengths, one compiled graph
            q, k, v = _dense(2, T, S, 4, 2, 32, 32, torch.float32, device, False)
            wo = torch.randn(2, T, 4, 32, device=device)
            wl = torch.randn(2, 4, T, device=device)
            eo, el, eg = _loss_and_grads(attn_fn, q, k, v, wo, wl)
            co, cl, cg = _loss_and_grads(compiled, q, k, v, wo, wl)
            torch.testing.assert_close(co, eo, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(cl, el, rtol=1e-6, atol=1e-6)
            for c, e in zip(cg, eg):
                torch.testing.assert_close(c, e, rtol=1e-5, atol=1e-5)


def varlen_fn(q, k, v, cq, ck):
    out, lse = attn_ops.attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, causal=True)
    return out, lse


def test_compile_varlen_dynamic(device):
    torch._dynamo.reset()
    compiled = torch.compile(varlen_fn, fullgraph=True, dynamic=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for lens_q, lens_k in [([5, 9], [7, 12]), ([3, 6, 20], [4, 8, 20])]:
            q, k, v, cu = _varlen(lens_q, lens_k, 4, 2, 16, 16, torch.float32, device, False)
            wo = torch.randn(sum(lens_q), 4, 16, device=device)
            wl = torch.randn(4, sum(lens_q), device=device)
            f_e = lambda q, k, v: varlen_fn(q, k, v, cu["cu_seqlens_q"], cu["cu_seqlens_k"])
            f_c = lambda q, k, v: compiled(q, k, v, cu["cu_seqlens_q"], cu["cu_seqlens_k"])
            eo, el, eg = _loss_and_grads(f_e, q, k, v, wo, wl)
            co, cl, cg = _loss_and_grads(f_c, q, k, v, wo, wl)
            torch.testing.assert_close(co, eo, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(cl, el, rtol=1e-6, atol=1e-6)
            for c, e in zip(cg, eg):
                torch.testing.assert_close(c, e, rtol=1e-5, atol=1e-5)


class GQAttention(nn.Module):
    """A small grouped-query attention block built on attn_ops.attention."""

    def __init__(self, dim=64, heads_q=4, heads_kv=2, head_dim=16):
        super().__init__()
        self.hq, self.hkv, self.hd = heads_q, heads_kv, head_dim
        self.q_proj = nn.Linear(dim, heads_q * head_dim)
        self.k_proj = nn.Linear(dim, heads_kv * head_dim)
        self.v_proj = nn.Linear(dim, heads_kv * head_dim)
        self.o_proj = nn.Linear(heads_q * head_dim, dim)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.hq, self.hd)
        k = self.k_proj(x).view(B, T, self.hkv, self.hd)
        v = self.v_proj(x).view(B, T, self.hkv, self.hd)
        out, _ = attn_ops.attention(q, k, v, causal=True)
        return self.o_proj(out.reshape(B, T, self.hq * self.hd))


def test_module_explain_no_graph_break(device):
    model = GQAttention().to(device)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(torch.randn(2, 12, 64, device=device))
    assert explanation.graph_break_count == 0, explanation.break_reasons


def test_module_training_step_compiled_matches_eager(device):
    torch._dynamo.reset()
    eager = GQAttention().to(device)
    comp_model = copy.deepcopy(eager)
    compiled = torch.compile(comp_model, fullgraph=True, dynamic=True)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(comp_model.parameters(), lr=0.1)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for T in (12, 20):
            x = torch.randn(2, T, 64, device=device)
            losses = []
            for model, opt in ((eager, opt_e), (compiled, opt_c)):
                opt.zero_grad()
                loss = model(x).square().mean()
                loss.backward()
                losses.append(loss.detach())
            torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
            for (n, pe), pc in zip(eager.named_parameters(), comp_model.parameters()):
                assert pc.grad is not None, n
                torch.testing.assert_close(pc.grad, pe.grad, rtol=1e-4, atol=1e-6, msg=n)
            opt_e.step()
            opt_c.step()
            for pe, pc in zip(eager.parameters(), comp_model.parameters()):
                torch.testing.assert_close(pc, pe, rtol=1e-5, atol=1e-6)
