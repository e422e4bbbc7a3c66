"""Attention sinks (gpt-oss) and chunked-local attention (Llama 4) on attention and attention_with_kvcache
(docs/attention_api.md, "Sinks and chunks"): each alone and combined with causal, windows, softcap, GQA/MQA,
varlen with empty sequences, Tq != Tk, Tq = 1, contiguous and paged caches (block sizes 1 and 16) with
cache_leftpad and packed queries; against the float64 reference of reference.py (a sink is one more key of
score sinks[h] and value 0; a chunk is a mask), every dtype with the tolerance rule. Gradients (sinks'
included) against the reference's autograd and gradcheck; opcheck; torch.compile; the bad inputs.
"""

import pytest
import torch
from torch.library import opcheck

import attn_ops
from error_helpers import expect_error
from reference import (assert_attention_close_to_ref, assert_close_to_ref, attention_ref, cu_seqlens,
                       same_dtype_ref)
from serving_reference import attention_with_kvcache_serving_ref

DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]


def sinks_for(Hq, dtype=torch.float32, requires_grad=False):
    # Logits around the scores' range, so the sink takes a visible share of each row.
    return (torch.randn(Hq, dtype=dtype) + 0.5).requires_grad_(requires_grad)


def dense(B, Tq, Tk, Hq, Hkv, D, dtype, requires_grad=False):
    return [torch.randn(B, T, H, D, dtype=dtype).requires_grad_(requires_grad)
            for T, H in ((Tq, Hq), (Tk, Hkv), (Tk, Hkv))]


# (Tq, Tk): decode, a chunk of new queries over a longer context, square, more queries than keys.
SHAPES = [(1, 150), (9, 200), (130, 130), (70, 40)]
# The pattern options, alone and with the masks and score options they combine with.
OPTIONS = {
    "sinks": dict(sinks=True),
    "chunk": dict(attention_chunk=32),
    "chunk_causal": dict(attention_chunk=16, causal=True),
    "sinks_chunk_causal": dict(sinks=True, attention_chunk=48, causal=True),
    "sinks_window": dict(sinks=True, window_left=24, causal=True),  # gpt-oss's sliding layers
    "chunk_window_softcap": dict(attention_chunk=20, window_left=30, window_right=5, softcap=6.0),
    "sinks_softcap": dict(sinks=True, softcap=4.0),
}


def resolved(opts, Hq):
    opts = dict(opts)
    if opts.pop("sinks", False):
        opts["sinks"] = sinks_for(Hq)
    return opts


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Tq,Tk", SHAPES)
@pytest.mark.parametrize("name", list(OPTIONS))
@pytest.mark.parametrize("Hq,Hkv", [(8, 2), (4, 1)])
def test_forward(dtype, Tq, Tk, name, Hq, Hkv):
    inputs = dense(2, Tq, Tk, Hq, Hkv, 32, dtype)
    opts = resolved(OPTIONS[name], Hq)
    assert_attention_close_to_ref(attn_ops.attention(*inputs, **opts), inputs, **opts)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["sinks", "chunk_causal", "sinks_chunk_causal"])
def test_varlen(dtype, name):
    lens_q, lens_k = [5, 0, 120, 1, 33], [5, 17, 150, 0, 90]
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    q = torch.randn(sum(lens_q), 6, 16, dtype=dtype)
    k, v = (torch.randn(sum(lens_k), 2, 16, dtype=dtype) for _ in range(2))
    opts = resolved(OPTIONS[name], 6)
    ours = attn_ops.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **opts)
    assert_attention_close_to_ref(ours, (q, k, v), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **opts)


def test_sinks_in_q_dtype_and_rows_without_keys():
    # bfloat16 sinks; rows 0 .. 9 see no key (Tq > Tk, causal): out 0 and lse = the sink.
    q, k, v = dense(1, 20, 10, 4, 2, 16, torch.bfloat16)
    sinks = sinks_for(4, torch.bfloat16)
    out, lse = attn_ops.attention(q, k, v, causal=True, sinks=sinks)
    assert torch.equal(out[0, :10], torch.zeros_like(out[0, :10]))
    assert torch.equal(lse[0, :, :10], sinks.float().unsqueeze(1).expand(4, 10))
    assert_attention_close_to_ref((out, lse), (q, k, v), causal=True, sinks=sinks)


def test_chunk_larger_than_every_sequence():
    # A chunk past every length leaves the keys at positions >= 0 in one chunk: the plain result when
    # Tq <= Tk, and no key for the queries at negative positions when Tq > Tk.
    q, k, v = dense(2, 30, 20, 4, 4, 16, torch.float64)
    for chunk in (21, 2 ** 62):
        out, lse = attn_ops.attention(q, k, v, attention_chunk=chunk)
        assert_attention_close_to_ref((out, lse), (q, k, v), attention_chunk=chunk)
        assert torch.all(torch.isneginf(lse[:, :, :10]))


# --------------------------------------------------------------------------------------------------
# Gradients
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["sinks", "sinks_chunk_causal", "chunk_window_softcap", "sinks_window"])
@pytest.mark.parametrize("Tq,Tk", [(1, 80), (60, 60), (70, 40)])
@pytest.mark.parametrize("use_lse", [False, True])
def test_gradients_match_reference(name, Tq, Tk, use_lse):
    inputs = dense(2, Tq, Tk, 4, 2, 16, torch.float64, requires_grad=True)
    opts = dict(OPTIONS[name])
    leaves = list(inputs)
    if opts.pop("sinks", False):
        opts["sinks"] = sinks_for(4, torch.float64, requires_grad=True)
        leaves.append(opts["sinks"])
    dout = torch.randn(2, Tq, 4, 16, dtype=torch.float64)
    dlse = torch.randn(2, 4, Tq, dtype=torch.float64)

    def loss(out, lse):
        return (out * dout).sum() + ((torch.where(torch.isinf(lse), 0, lse) * dlse).sum() if use_lse else 0)

    ours = torch.autograd.grad(loss(*attn_ops.attention(*inputs, **opts)), leaves)
    ref = torch.autograd.grad(loss(*attention_ref(*inputs, **opts)), leaves)
    for name_, a, b in zip(["dq", "dk", "dv", "dsinks"], ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=name_)


@pytest.mark.parametrize("varlen", [False, True])
def test_gradcheck(varlen):
    torch.manual_seed(1)
    sinks = sinks_for(4, torch.float64, requires_grad=True)
    if varlen:
        cu_q, cu_k = cu_seqlens([3, 0, 9]), cu_seqlens([4, 2, 11])
        q = torch.randn(12, 4, 8, dtype=torch.float64, requires_grad=True)
        k, v = (torch.randn(17, 2, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
        kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    else:
        q, k, v = dense(2, 9, 11, 4, 2, 8, torch.float64, requires_grad=True)
        kw = {}

    def f(q, k, v, sinks):
        out, lse = attn_ops.attention(q, k, v, causal=True, attention_chunk=4, sinks=sinks, **kw)
        return out, torch.where(torch.isinf(lse), 0, lse)

    assert torch.autograd.gradcheck(f, (q, k, v, sinks))


def test_sink_gradient_in_float32_sinks_for_bfloat16_inputs():
    # float32 sinks of a bfloat16 model (gpt-oss keeps them in the model dtype or float32): a float32 grad.
    q, k, v = dense(1, 33, 33, 4, 2, 16, torch.bfloat16, requires_grad=True)
    sinks = sinks_for(4, requires_grad=True)
    out, _ = attn_ops.attention(q, k, v, causal=True, sinks=sinks)
    out.float().square().sum().backward()
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    sd = sinks.detach().double().requires_grad_()
    ref_out, _ = attention_ref(qd, kd, vd, causal=True, sinks=sd)
    ref_out.square().sum().backward()
    assert sinks.grad.dtype == torch.float32
    torch.testing.assert_close(sinks.grad.double(), sd.grad, rtol=0.05, atol=0.05 * sd.grad.abs().max().item())


# --------------------------------------------------------------------------------------------------
# Over a KV cache
# --------------------------------------------------------------------------------------------------
def paged(cache_rows, block_size):
    """A paged copy of contiguous cache rows [B, capacity, H, D] through a shuffled block table."""
    B, capacity = cache_rows.shape[:2]
    mb = capacity // block_size
    table = torch.randperm(B * mb + 2)[:B * mb].reshape(B, mb).to(torch.int32)
    pool = torch.randn(B * mb + 2, block_size, *cache_rows.shape[2:], dtype=cache_rows.dtype)
    pool[table.flatten().long()] = cache_rows.reshape(B * mb, block_size, *cache_rows.shape[2:])
    return pool, table


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [None, 1, 16])
@pytest.mark.parametrize("name", ["sinks", "chunk_causal", "sinks_chunk_causal", "sinks_window"])
@pytest.mark.parametrize("packed", [False, True])
def test_with_kvcache(dtype, block_size, name, packed):
    lens_q = [1, 5, 1] if packed else [3, 3, 3]
    lens_k, leftpad = [40, 77, 3], [7, 0, 3]  # the last row padded up to its length: no key
    capacity, Hq, Hkv, D = 96, 8, 2, 32
    kc, vc = (torch.randn(3, capacity, Hkv, D, dtype=dtype) for _ in range(2))
    q = torch.randn(sum(lens_q), Hq, D, dtype=dtype) if packed else torch.randn(3, 3, Hq, D, dtype=dtype)
    kw = dict(cache_leftpad=torch.tensor(leftpad, dtype=torch.int32))
    if packed:
        kw["cu_seqlens_q"] = cu_seqlens(lens_q)
    if block_size is not None:
        (kc, table), (vc, _) = paged(kc, block_size), (None, None)
        vc = torch.randn_like(kc)
        kw["block_table"] = table
    opts = dict(OPTIONS[name], causal=True)
    opts = resolved(opts, Hq)
    lens = torch.tensor(lens_k, dtype=torch.int32)
    out, lse = attn_ops.attention_with_kvcache(q, kc, vc, lens, **kw, **opts)
    ref = attention_with_kvcache_serving_ref(q, kc, vc, lens, **kw, **opts)
    same = same_dtype_ref(attention_with_kvcache_serving_ref, q, kc, vc, lens, **kw, **opts, compute_dtype=dtype)
    assert_close_to_ref(out, ref[0], same[0], name="out")
    assert_close_to_ref(lse, ref[1], same[1], name="lse")


def test_with_kvcache_long_decode_splits():
    # A long cache is split over threads and merged: the sink joins once, after the merge.
    q = torch.randn(1, 1, 8, 64)
    kc, vc = (torch.randn(1, 8192, 2, 64) for _ in range(2))
    lens = torch.tensor([8000], dtype=torch.int32)
    sinks = sinks_for(8)
    out, lse = attn_ops.attention_with_kvcache(q, kc, vc, lens, sinks=sinks, attention_chunk=5000)
    ref = attention_with_kvcache_serving_ref(q, kc, vc, lens, sinks=sinks, attention_chunk=5000)
    same = same_dtype_ref(attention_with_kvcache_serving_ref, q, kc, vc, lens, sinks=sinks, attention_chunk=5000,
                          compute_dtype=q.dtype)
    assert_close_to_ref(out, ref[0], same[0], name="out")
    assert_close_to_ref(lse, ref[1], same[1], name="lse")


# --------------------------------------------------------------------------------------------------
# CUDA (the GPU check's cuda stage runs these: -k cuda)
# --------------------------------------------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("D", [64, 128])
def test_cuda_attention_sinks_and_chunk(dtype, D):
    # Window::keys_of / queries_of with a chunk in the forward and backward kernels; sinks added after them.
    q, k, v = dense(2, 130, 150, 8, 2, D, dtype, requires_grad=True)
    # sinks in q's dtype: their gradient sums rowsum(dout * out) with out rounded to it, the rule's rounded
    # intermediate (as in tests/test_nn_modules.py)
    sinks = sinks_for(8, dtype, requires_grad=True)
    opts = dict(causal=True, attention_chunk=48)
    dev = [t.detach().cuda().requires_grad_() for t in (q, k, v, sinks)]
    out, lse = attn_ops.attention(*dev[:3], sinks=dev[3], **opts)
    assert_attention_close_to_ref((out.cpu(), lse.cpu()), (q, k, v), sinks=sinks, **opts)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, dev, dout)
    leaves = [q, k, v, sinks]
    ref64 = torch.autograd.grad(attention_ref(*(t.double() for t in (q, k, v)), sinks=sinks.double(), **opts)[0],
                                leaves, dout.cpu().double())
    baseline = torch.autograd.grad(same_dtype_ref(attention_ref, q, k, v, sinks=sinks, **opts, compute_dtype=dtype)[0],
                                   leaves, dout.cpu())
    for name, a, b64, b in zip(["dq", "dk", "dv", "dsinks"], grads, ref64, baseline):
        assert_close_to_ref(a.cpu(), b64, b, name=name, rounded_intermediates=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
@pytest.mark.parametrize("block_size", [None, 16])
def test_cuda_with_kvcache_sinks_and_chunk(block_size):
    capacity, Hq, Hkv, D = 96, 8, 2, 64
    kc, vc = (torch.randn(3, capacity, Hkv, D, dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(3, 2, Hq, D, dtype=torch.bfloat16)
    kw = dict(cache_leftpad=torch.tensor([7, 0, 3], dtype=torch.int32))
    if block_size is not None:
        kc, kw["block_table"] = paged(kc, block_size)
        vc = torch.randn_like(kc)
    lens = torch.tensor([40, 77, 3], dtype=torch.int32)
    opts = dict(causal=True, sinks=sinks_for(Hq), attention_chunk=16)
    out, lse = attn_ops.attention_with_kvcache(q.cuda(), kc.cuda(), vc.cuda(), lens.cuda(),
                                               **{n: t.cuda() for n, t in kw.items()},
                                               **{n: t.cuda() if isinstance(t, torch.Tensor) else t
                                                  for n, t in opts.items()})
    ref = attention_with_kvcache_serving_ref(q, kc, vc, lens, **kw, **opts)
    same = same_dtype_ref(attention_with_kvcache_serving_ref, q, kc, vc, lens, **kw, **opts,
                          compute_dtype=torch.bfloat16)
    assert_close_to_ref(out.cpu(), ref[0], same[0], name="out")
    assert_close_to_ref(lse.cpu(), ref[1], same[1], name="lse")


# --------------------------------------------------------------------------------------------------
# opcheck, torch.compile
# --------------------------------------------------------------------------------------------------
def test_opcheck():
    q, k, v = dense(2, 9, 13, 4, 2, 16, torch.float32, requires_grad=True)
    sinks = sinks_for(4, requires_grad=True)
    opcheck(torch.ops.attn_ops.attention.default, (q, k, v), dict(causal=True, sinks=sinks, attention_chunk=4))
    out, lse = attn_ops.attention(q, k, v, causal=True, sinks=sinks, attention_chunk=4)
    opcheck(torch.ops.attn_ops.attention_backward.default,
            (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse.detach()),
            dict(causal=True, attention_chunk=4))
    kc, vc = (torch.randn(2, 24, 2, 16) for _ in range(2))
    lens = torch.tensor([20, 3], dtype=torch.int32)
    opcheck(torch.ops.attn_ops.attention_with_kvcache.default, (q.detach()[:, :2], kc, vc, lens),
            dict(sinks=sinks.detach(), attention_chunk=8))


def test_compile_fullgraph_dynamic():
    sinks = sinks_for(4, requires_grad=True)

    def step(q, k, v, sinks):
        out, lse = torch.ops.attn_ops.attention(q, k, v, causal=True, sinks=sinks, attention_chunk=8)
        return out.sum() + lse.sum()

    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for T in (17, 29):
        inputs = dense(1, T, T, 4, 2, 16, torch.float32, requires_grad=True)
        grads = torch.autograd.grad(compiled(*inputs, sinks), [*inputs, sinks])
        expected = torch.autograd.grad(step(*inputs, sinks), [*inputs, sinks])
        for a, b in zip(grads, expected):
            torch.testing.assert_close(a, b)


# --------------------------------------------------------------------------------------------------
# Bad inputs
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["attention", "attention_with_kvcache"])
def test_bad_inputs(op):
    q = torch.randn(2, 3, 4, 16)
    if op == "attention":
        args = (q, torch.randn(2, 5, 2, 16), torch.randn(2, 5, 2, 16))
    else:
        args = (q, torch.randn(2, 8, 2, 16), torch.randn(2, 8, 2, 16), torch.tensor([5, 6], dtype=torch.int32))
    expect_error(op, "sinks must have shape [4] (one logit per query head), got [2, 2]", *args,
                 sinks=torch.zeros(2, 2), exact=True)
    expect_error(op, "sinks must have shape [4] (one logit per query head), got [3]", *args, sinks=torch.zeros(3),
                 exact=True)
    expect_error(op, "sinks must be float32 or q's dtype (float32), got float64", *args,
                 sinks=torch.zeros(4, dtype=torch.float64), exact=True)
    expect_error(op, "sinks must be float32 or q's dtype (float32), got int32", *args,
                 sinks=torch.zeros(4, dtype=torch.int32), exact=True)
    expect_error(op, "sinks must be on the same device as q (cpu), got meta", *args,
                 sinks=torch.zeros(4, device="meta"), exact=True)
    expect_error(op, "attention_chunk must be >= 0 (0 disables chunking), got -1", *args, attention_chunk=-1,
                 exact=True)


def test_backward_rejects_negative_chunk():
    q, k, v = dense(1, 3, 3, 2, 2, 8, torch.float32)
    out, lse = attn_ops.attention(q, k, v)
    expect_error("attention_backward", "attention_chunk must be >= 0 (0 disables chunking), got -2",
                 torch.ones_like(out), q, k, v, out, lse, attention_chunk=-2, exact=True)


# --------------------------------------------------------------------------------------------------
# Modules
# --------------------------------------------------------------------------------------------------
def test_module_options_and_tensor_parallel_shard():
    """GroupedQueryAttention(sinks=True) holds gpt-oss's parameter (numerics: tests/test_nn_modules.py); a
    tensor-parallel shard keeps its own heads' sinks and the chunk."""
    from attn_ops.nn import GroupedQueryAttention
    from attn_ops.parallel.layers import TensorParallelGroupedQueryAttention
    module = GroupedQueryAttention(64, 4, 2, sinks=True, attention_chunk=8)
    assert module.sinks.shape == (4,) and module.sinks.requires_grad and "sinks" in module.state_dict()
    assert "sinks=True, attention_chunk=8" in repr(module)
    assert GroupedQueryAttention(64, 4, 2).sinks is None
    with torch.no_grad():
        module.sinks.copy_(torch.randn(4))
    shard = TensorParallelGroupedQueryAttention.from_module(module, 1, 2, None)
    assert torch.equal(shard.sinks, module.sinks[2:]) and shard.attention_chunk == 8
    with pytest.raises(ValueError, match="attention_chunk must be >= 0"):
        GroupedQueryAttention(64, 4, 2, attention_chunk=-1)
