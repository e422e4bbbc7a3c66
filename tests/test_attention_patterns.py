"""Attention sinks (gpt-oss), ALiBi (BLOOM, MPT) and chunked-local attention (Llama 4) on attention and
attention_with_kvcache (docs/attention_api.md, "Sinks, ALiBi and chunks"): each alone and combined with causal,
windows, softcap, GQA/MQA, varlen with empty sequences, Tq != Tk, Tq = 1, contiguous and paged caches (block
sizes 1 and 16) with cache_leftpad and packed queries; against the float64 reference of reference.py (a sink is
one more key of score sinks[h] and value 0; ALiBi a bias after the cap; a chunk is a mask), every dtype with the
tolerance rule. Gradients (sinks' included) against the reference's autograd and gradcheck; opcheck;
torch.compile; the bad inputs.
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


def slopes_for(Hq, B=None):
    # Slopes [Hq] (or [B, Hq]) from BLOOM's range down to a few keys' reach, so the bias changes every row.
    return torch.rand(Hq if B is None else (B, Hq)) * 0.25 + 0.005


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
    "alibi": dict(alibi="head"),
    "alibi_batch_causal": dict(alibi="batch", causal=True),  # BLOOM's layers: causal, per-row slopes
    "alibi_softcap_window": dict(alibi="head", softcap=5.0, window_left=20, window_right=3),
    "alibi_sinks_chunk_causal": dict(alibi="batch", sinks=True, attention_chunk=24, causal=True),
}


def resolved(opts, Hq, B=2):
    """The options with tensors: sinks=True -> sink logits [Hq]; alibi="head" / "batch" -> slopes [Hq] / [B, Hq]."""
    opts = dict(opts)
    if opts.pop("sinks", False):
        opts["sinks"] = sinks_for(Hq)
    alibi = opts.pop("alibi", None)
    if alibi is not None:
        opts["alibi_slopes"] = slopes_for(Hq, B if alibi == "batch" else None)
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
@pytest.mark.parametrize("name", ["sinks", "chunk_causal", "sinks_chunk_causal", "alibi_batch_causal",
                                  "alibi_softcap_window"])
def test_varlen(dtype, name):
    lens_q, lens_k = [5, 0, 120, 1, 33], [5, 17, 150, 0, 90]
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    q = torch.randn(sum(lens_q), 6, 16, dtype=dtype)
    k, v = (torch.randn(sum(lens_k), 2, 16, dtype=dtype) for _ in range(2))
    opts = resolved(OPTIONS[name], 6, B=len(lens_q))
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
@pytest.mark.parametrize("name", ["sinks", "sinks_chunk_causal", "chunk_window_softcap", "sinks_window",
                                  "alibi_batch_causal", "alibi_softcap_window", "alibi_sinks_chunk_causal"])
@pytest.mark.parametrize("Tq,Tk", [(1, 80), (60, 60), (70, 40)])
@pytest.mark.parametrize("use_lse", [False, True])
def test_gradients_match_reference(name, Tq, Tk, use_lse):
    inputs = dense(2, Tq, Tk, 4, 2, 16, torch.float64, requires_grad=True)
    opts = resolved(OPTIONS[name], 4)
    leaves = list(inputs)
    if "sinks" in opts:
        opts["sinks"] = opts["sinks"].double().requires_grad_()
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

    slopes = slopes_for(4, 3 if varlen else 2)

    def f(q, k, v, sinks):
        out, lse = attn_ops.attention(q, k, v, causal=True, attention_chunk=4, sinks=sinks, alibi_slopes=slopes,
                                      **kw)
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
@pytest.mark.parametrize("name", ["sinks", "chunk_causal", "sinks_chunk_causal", "sinks_window", "alibi_batch_causal",
                                  "alibi_sinks_chunk_causal"])
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
    opts = resolved(opts, Hq, B=3)
    lens = torch.tensor(lens_k, dtype=torch.int32)
    out, lse = attn_ops.attention_with_kvcache(q, kc, vc, lens, **kw, **opts)
    ref = attention_with_kvcache_serving_ref(q, kc, vc, lens, **kw, **opts)
    same = same_dtype_ref(attention_with_kvcache_serving_ref, q, kc, vc, lens, **kw, **opts, compute_dtype=dtype)
    assert_close_to_ref(out, ref[0], same[0], name="out")
    assert_close_to_ref(lse, ref[1], same[1], name="lse")


@pytest.mark.parametrize("Tq", [1, 12])  # the streaming and the GEMM decode kernels
def test_with_kvcache_long_decode_splits(Tq):
    # A long cache is split over threads and merged: the sink joins once, after the merge; each split's ALiBi
    # counts from its own first key. Small slopes keep distant keys in the result.
    q = torch.randn(1, Tq, 8, 64)
    kc, vc = (torch.randn(1, 8192, 2, 64) for _ in range(2))
    lens = torch.tensor([8000], dtype=torch.int32)
    opts = dict(sinks=sinks_for(8), attention_chunk=5000, alibi_slopes=torch.rand(8) * 1e-3)
    out, lse = attn_ops.attention_with_kvcache(q, kc, vc, lens, **opts)
    ref = attention_with_kvcache_serving_ref(q, kc, vc, lens, **opts)
    same = same_dtype_ref(attention_with_kvcache_serving_ref, q, kc, vc, lens, **opts, compute_dtype=q.dtype)
    assert_close_to_ref(out, ref[0], same[0], name="out")
    assert_close_to_ref(lse, ref[1], same[1], name="lse")


# --------------------------------------------------------------------------------------------------
# CUDA (the GPU check's cuda stage runs these: -k cuda)
# --------------------------------------------------------------------------------------------------
# The options of the CUDA checks: sinks and chunks (Window's chunk in the forward and backward kernels, sinks added
# after them), ALiBi with a window ([B, Hq] slopes; the forward kernels, tensor-core and row, and the row backward).
CUDA_OPTIONS = {"sinks_chunk": dict(causal=True, sinks=True, attention_chunk=48),
                "alibi_window": dict(causal=True, window_left=90, alibi="batch")}


def on_cuda(opts):
    return {n: t.cuda() if isinstance(t, torch.Tensor) else t for n, t in opts.items()}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("name", list(CUDA_OPTIONS))
def test_cuda_attention_patterns(name, dtype, D):
    q, k, v = dense(2, 130, 150, 8, 2, D, dtype, requires_grad=True)
    opts = resolved(CUDA_OPTIONS[name], 8)
    leaves = [q, k, v]
    if "sinks" in opts:
        # sinks in q's dtype: their gradient sums rowsum(dout * out) with out rounded to it, the rule's rounded
        # intermediate (as in tests/test_nn_modules.py)
        opts["sinks"] = opts["sinks"].to(dtype).requires_grad_()
        leaves.append(opts["sinks"])
    dev = [t.detach().cuda().requires_grad_() for t in leaves]
    dev_opts = dict(on_cuda(opts), **({"sinks": dev[3]} if "sinks" in opts else {}))
    out, lse = attn_ops.attention(*dev[:3], **dev_opts)
    assert_attention_close_to_ref((out.cpu(), lse.cpu()), (q, k, v), **opts)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, dev, dout)
    ref64_opts = {n: t.double() if n == "sinks" else t for n, t in opts.items()}
    ref64 = torch.autograd.grad(attention_ref(*(t.double() for t in (q, k, v)), **ref64_opts)[0], leaves,
                                dout.cpu().double())
    baseline = torch.autograd.grad(same_dtype_ref(attention_ref, q, k, v, **opts, compute_dtype=dtype)[0], leaves,
                                   dout.cpu())
    for grad_name, a, b64, b in zip(["dq", "dk", "dv", "dsinks"], grads, ref64, baseline):
        assert_close_to_ref(a.cpu(), b64, b, name=grad_name, rounded_intermediates=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
@pytest.mark.parametrize("block_size", [None, 16])
@pytest.mark.parametrize("name", ["sinks_chunk", "alibi_window"])
def test_cuda_with_kvcache_patterns(name, block_size):
    capacity, Hq, Hkv, D = 96, 8, 2, 64
    kc, vc = (torch.randn(3, capacity, Hkv, D, dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(3, 2, Hq, D, dtype=torch.bfloat16)
    kw = dict(cache_leftpad=torch.tensor([7, 0, 3], dtype=torch.int32))
    if block_size is not None:
        kc, kw["block_table"] = paged(kc, block_size)
        vc = torch.randn_like(kc)
    lens = torch.tensor([40, 77, 3], dtype=torch.int32)
    opts = resolved(dict(CUDA_OPTIONS[name], attention_chunk=16) if name == "sinks_chunk" else CUDA_OPTIONS[name],
                    Hq, B=3)
    out, lse = attn_ops.attention_with_kvcache(q.cuda(), kc.cuda(), vc.cuda(), lens.cuda(), **on_cuda(kw),
                                               **on_cuda(opts))
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
    slopes = slopes_for(4, 2)
    opcheck(torch.ops.attn_ops.attention.default, (q, k, v), dict(causal=True, sinks=sinks, alibi_slopes=slopes))
    opcheck(torch.ops.attn_ops.attention_backward.default,
            (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse.detach()),
            dict(causal=True, alibi_slopes=slopes))
    opcheck(torch.ops.attn_ops.attention_with_kvcache.default, (q.detach()[:, :2], kc, vc, lens),
            dict(alibi_slopes=slopes[0]))


def test_compile_fullgraph_dynamic():
    sinks = sinks_for(4, requires_grad=True)

    slopes = slopes_for(4)

    def step(q, k, v, sinks):
        out, lse = torch.ops.attn_ops.attention(q, k, v, causal=True, sinks=sinks, attention_chunk=8,
                                                alibi_slopes=slopes)
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
    shape = ("alibi_slopes must have shape [4] or [2, 4] (one slope per query head, or per sequence and query "
             "head), got ")
    cases = [("sinks must have shape [4] (one logit per query head), got [2, 2]", dict(sinks=torch.zeros(2, 2))),
             ("sinks must have shape [4] (one logit per query head), got [3]", dict(sinks=torch.zeros(3))),
             ("sinks must be float32 or q's dtype (float32), got float64",
              dict(sinks=torch.zeros(4, dtype=torch.float64))),
             ("sinks must be float32 or q's dtype (float32), got int32", dict(sinks=torch.zeros(4, dtype=torch.int32))),
             ("sinks must be on the same device as q (cpu), got meta", dict(sinks=torch.zeros(4, device="meta"))),
             ("attention_chunk must be >= 0 (0 disables chunking), got -1", dict(attention_chunk=-1)),
             *[(shape + str(bad).replace(" ", "").replace(",", ", "), dict(alibi_slopes=torch.rand(bad)))
               for bad in ([3], [2, 3], [3, 4], [1, 4], [2, 4, 1])],
             ("alibi_slopes must be float32, got float64", dict(alibi_slopes=torch.rand(4, dtype=torch.float64))),
             ("alibi_slopes must be float32, got bfloat16", dict(alibi_slopes=torch.rand(4, dtype=torch.bfloat16))),
             ("alibi_slopes must be on the same device as q (cpu), got meta",
              dict(alibi_slopes=torch.rand(4, device="meta"))),
             ("alibi_slopes is not differentiable but requires grad; pass alibi_slopes.detach()",
              dict(alibi_slopes=torch.rand(4, requires_grad=True)))]
    for message, kwargs in cases:
        expect_error(op, message, *args, **kwargs, exact=True)
    with torch.no_grad():  # no graph to differentiate: accepted
        getattr(attn_ops, op)(*args, alibi_slopes=torch.rand(4, requires_grad=True))


def test_backward_rejects_bad_pattern_options():
    q, k, v = dense(1, 3, 3, 2, 2, 8, torch.float32)
    out, lse = attn_ops.attention(q, k, v)
    args = (torch.ones_like(out), q, k, v, out, lse)
    expect_error("attention_backward", "attention_chunk must be >= 0 (0 disables chunking), got -2", *args,
                 attention_chunk=-2, exact=True)
    expect_error("attention_backward", "alibi_slopes must be float32, got float16", *args,
                 alibi_slopes=torch.rand(2, dtype=torch.float16), exact=True)


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


def test_alibi_slopes_and_module_shards():
    """attn_ops.alibi_slopes: BLOOM's slopes (6 heads: the 4-head sequence, then the odd powers of 2^-1); a
    module with alibi=True passes its heads' slopes, kept float32 through casts; a tensor-parallel shard its
    own heads' slice."""
    from attn_ops.nn import GroupedQueryAttention
    from attn_ops.parallel.layers import TensorParallelGroupedQueryAttention
    assert attn_ops.alibi_slopes(6).tolist() == [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]
    assert attn_ops.alibi_slopes(8).tolist() == [2.0 ** -k for k in range(1, 9)]
    assert attn_ops.alibi_slopes(1).tolist() == [2 ** -8] and attn_ops.alibi_slopes(3).dtype == torch.float32
    with pytest.raises(ValueError, match="num_heads must be >= 1, got 0"):
        attn_ops.alibi_slopes(0)
    module = GroupedQueryAttention(64, 4, 2, alibi=True).to(torch.bfloat16)
    assert module.alibi_slopes.dtype == torch.float32 and torch.equal(module.alibi_slopes, attn_ops.alibi_slopes(4))
    assert "alibi=True" in repr(module) and GroupedQueryAttention(64, 4, 2).alibi_slopes is None
    shard = TensorParallelGroupedQueryAttention.from_module(module, 1, 2, None)
    assert torch.equal(shard.alibi_slopes, attn_ops.alibi_slopes(4)[2:])
