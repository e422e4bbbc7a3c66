"""The size hints of the varlen ops (max_seqlen_q / max_seqlen_k / max_seqlen) under torch.compile: one graph
for every value, eager's results.

They were `int?` in the schemas, so torch.compile turned a symbolic hint into a constant and guarded on it: a
packed batch whose longest sequence changed recompiled on every step, and fullgraph=True failed once the
recompile limit (8) was hit. flash_attn_varlen_func, whose max_seqlen arguments are required, hit that in
every compiled varlen training loop. Each test runs more distinct hints than that limit, with
error_on_recompile after the first call (the total token count stays fixed, so only the hint changes).
"""
import pytest
import torch

import attn_ops
from attn_ops.flash_attn_interface import flash_attn_varlen_func
from lightning_reference import minimax_slopes

TOTAL = 40
LONGEST = range(21, 31)  # ten hints, none equal to another size of the call (no duck-sizing link)


def _cu(longest, device):
    return torch.tensor([0, longest, TOTAL], dtype=torch.int32, device=device)


def _run_each_hint(fn, make_args, device):
    """fn compiled once (fullgraph, dynamic) against eager over every hint in LONGEST, gradients included when
    make_args gives tensors that require grad."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True)
    for step, longest in enumerate(LONGEST):
        args = make_args(longest)
        eager_args = [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                      for a in args]
        with torch._dynamo.config.patch(error_on_recompile=step > 0):
            got = compiled(*args)
        want = fn(*eager_args)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        grads = [(a, e) for a, e in zip(args, eager_args) if isinstance(a, torch.Tensor) and a.requires_grad]
        if grads:
            sum(g.square().sum() for g in got).backward()
            sum(w.square().sum() for w in want).backward()
            for a, e in grads:
                torch.testing.assert_close(a.grad, e.grad, rtol=1e-5, atol=1e-5)


def _packed(device, *shape, grad=False):
    return torch.randn(TOTAL, *shape, device=device).requires_grad_(grad)


def test_attention_varlen_hints(device):
    def fn(q, k, v, cu, longest):
        return attn_ops.attention(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest,
                                  max_seqlen_k=longest)

    _run_each_hint(fn, lambda m: (_packed(device, 4, 8, grad=True), _packed(device, 2, 8, grad=True),
                                  _packed(device, 2, 8, grad=True), _cu(m, device), m), device)


def test_flash_attn_varlen_func_hints(device):
    def fn(q, k, v, cu, longest):
        return flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=True)

    _run_each_hint(fn, lambda m: (_packed(device, 4, 8, grad=True), _packed(device, 2, 8),
                                  _packed(device, 2, 8), _cu(m, device), m), device)


def test_attention_with_kvcache_packed_queries_hint(device):
    cache = torch.randn(2, 64, 2, 8, device=device), torch.randn(2, 64, 2, 8, device=device)
    lens = torch.tensor([45, 50], dtype=torch.int32, device=device)

    def fn(q, cu, longest):
        return attn_ops.attention_with_kvcache(q, cache[0], cache[1], lens, cu_seqlens_q=cu, max_seqlen_q=longest)

    _run_each_hint(fn, lambda m: (_packed(device, 4, 8), _cu(m, device), m), device)


def test_mla_decode_packed_queries_hint(device):
    latent = torch.randn(2, 64, 20, device=device)
    lens = torch.tensor([45, 50], dtype=torch.int32, device=device)

    def fn(q_latent, q_rope, cu, longest):
        return attn_ops.mla_decode(q_latent, q_rope, latent, lens, scale=0.3, cu_seqlens_q=cu, max_seqlen_q=longest)

    _run_each_hint(fn, lambda m: (_packed(device, 4, 16), _packed(device, 4, 4), _cu(m, device), m), device)


def test_lightning_attention_varlen_hint(device):
    slope = minimax_slopes(4).to(device)

    def fn(q, k, v, cu, longest):
        return attn_ops.lightning_attention(q, k, v, slope, cu_seqlens=cu, max_seqlen=longest)

    _run_each_hint(fn, lambda m: (_packed(device, 4, 8, grad=True), _packed(device, 4, 8, grad=True),
                                  _packed(device, 4, 8, grad=True), _cu(m, device), m), device)


@pytest.mark.parametrize("op", ["attention", "lightning_attention"])
def test_a_hint_below_the_longest_sequence_is_still_rejected(op):
    """The compiled graph's kernels check the concrete hint as eager does."""
    q = _packed("cpu", 4, 8)
    cu = _cu(25, "cpu")
    if op == "attention":
        fn = lambda m: attn_ops.attention(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=m,  # noqa: E731
                                          max_seqlen_k=m)
    else:
        fn = lambda m: attn_ops.lightning_attention(q, q, q, minimax_slopes(4), cu_seqlens=cu,  # noqa: E731
                                                    max_seqlen=m)
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True)
    compiled(30)
    with pytest.raises(RuntimeError, match=r"\(24\) is smaller than the longest sequence"):
        compiled(24)
