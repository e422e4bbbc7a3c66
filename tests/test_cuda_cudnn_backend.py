"""The cuDNN backend on a GPU (the GPU check's cuda stage runs these): each class the router sends to cuDNN, run
through ATTN_OPS_ATTENTION_BACKEND=auto, cudnn and native, against the float64 reference with the tolerance rule;
the route each took (torch.ops.attn_ops._cuda_last_route); rows with no visible key (out 0, lse -inf) on both
backends; a call cuDNN does not take, forced to cuDNN, raises naming why. Needs a build with the cuDNN backend.
"""
import pytest
import torch

import attn_ops
from reference import assert_attention_close_to_ref, assert_close_to_ref, attention_ref, same_dtype_ref
from serving_reference import attention_with_kvcache_serving_ref

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available"),
    pytest.mark.skipif(not torch._C._dispatch_has_kernel_for_dispatch_key("attn_ops::_cudnn_validate_attention",
                                                                          "CompositeExplicitAutograd"),
                       reason="this build has no cuDNN backend"),
]
BACKENDS = ["auto", "cudnn", "native"]


def last_route(stage):
    return torch.ops.attn_ops._cuda_last_route(torch.empty(0, device="cuda"), stage)


@pytest.fixture
def backend(monkeypatch, request):
    monkeypatch.setenv("ATTN_OPS_ATTENTION_BACKEND", request.param)
    return request.param


def expected_backend(backend):
    return "native" if backend == "native" else "cudnn"


# (dqk, dv, Tq, Tk, options): dense classes the router sends to cuDNN on an H100 / H200
DENSE = {
    "causal_d128": (128, 128, 256, 256, dict(causal=True)),
    "window_d64": (64, 64, 200, 300, dict(causal=True, window_left=63)),
    "deepseek_192_128": (192, 128, 128, 128, dict(causal=True)),
    "unmasked_more_queries": (128, 128, 300, 100, dict()),
}


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("name", list(DENSE))
def test_cuda_dense_forward_backward(name, backend):
    dqk, dv, tq, tk, opts = DENSE[name]
    q = torch.randn(2, tq, 8, dqk, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, tk, 2, dqk, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, tk, 2, dv, dtype=torch.bfloat16, requires_grad=True)
    dev = [t.detach().cuda().requires_grad_() for t in (q, k, v)]
    out, lse = attn_ops.attention(*dev, **opts)
    assert last_route("forward").startswith(expected_backend(backend))
    assert_attention_close_to_ref((out.cpu(), lse.cpu()), (q, k, v), **opts)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, dev, dout)
    assert last_route("backward").startswith(expected_backend(backend))
    ref64 = torch.autograd.grad(attention_ref(*(t.double() for t in (q, k, v)), **opts)[0], (q, k, v),
                                dout.cpu().double())
    same = torch.autograd.grad(same_dtype_ref(attention_ref, q, k, v, **opts, compute_dtype=torch.bfloat16)[0],
                               (q, k, v), dout.cpu())
    for grad_name, a, b64, b in zip("qkv", grads, ref64, same):
        assert_close_to_ref(a.cpu(), b64, b, name=f"d{grad_name}", rounded_intermediates=True)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("block_size", [None, 16])
@pytest.mark.parametrize("tq", [1, 8])
def test_cuda_cache_forward(backend, block_size, tq):
    # the last row's cache is empty: its queries see no key (out 0, lse -inf)
    B, capacity, D = 4, 256, 128
    lens = torch.tensor([256, 77, 9, 0], dtype=torch.int32)
    kc, vc = (torch.randn(B, capacity, 2, D, dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(B, tq, 8, D, dtype=torch.bfloat16)
    kw = {}
    if block_size is not None:
        table = torch.randperm(B * capacity // block_size).to(torch.int32).view(B, -1)
        pool_k = torch.empty(B * capacity // block_size, block_size, 2, D, dtype=torch.bfloat16)
        pool_v = torch.empty_like(pool_k)
        pool_k[table.flatten().long()] = kc.view(-1, block_size, 2, D)
        pool_v[table.flatten().long()] = vc.view(-1, block_size, 2, D)
        kc, vc, kw = pool_k, pool_v, dict(block_table=table)
    out, lse = attn_ops.attention_with_kvcache(q.cuda(), kc.cuda(), vc.cuda(), lens.cuda(),
                                               **{n: t.cuda() for n, t in kw.items()})
    assert last_route("forward").startswith(expected_backend(backend))
    ref = attention_with_kvcache_serving_ref(q, kc, vc, lens, **kw)
    same = same_dtype_ref(attention_with_kvcache_serving_ref, q, kc, vc, lens, **kw, compute_dtype=torch.bfloat16)
    assert_close_to_ref(out.cpu(), ref[0], same[0], name="out")
    assert_close_to_ref(lse.cpu(), ref[1], same[1], name="lse")
    assert torch.equal(out[3].cpu(), torch.zeros_like(out[3].cpu()))
    assert torch.all(torch.isneginf(lse[3].cpu()))


def test_cuda_forcing_cudnn_on_a_kept_call_names_why(monkeypatch):
    monkeypatch.setenv("ATTN_OPS_ATTENTION_BACKEND", "cudnn")
    q = torch.randn(1, 16, 4, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="ATTN_OPS_ATTENTION_BACKEND=cudnn, but cuDNN does not take this call: "
                                           "softcap"):
        attn_ops.attention(q, q, q, causal=True, softcap=30.0)
    monkeypatch.setenv("ATTN_OPS_ATTENTION_BACKEND", "auto")
    attn_ops.attention(q, q, q, causal=True, softcap=30.0)
    assert last_route("forward").startswith("native: softcap")
