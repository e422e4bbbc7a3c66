"""How to run, not what: attention_with_kvcache's num_splits (0 automatic, 1 no key splits, n at most n) and
attention / attention_backward's deterministic (docs/attention_api.md, docs/kvcache_api.md). Results against the
float64 reference for every setting; with num_splits=1 a decode row's result is the same bits whatever batch it
is in; the backward is bitwise repeatable (the CPU's always; CUDA's with deterministic=True, in the GPU check).
"""
import pytest
import torch
from torch.library import opcheck

import attn_ops
from error_helpers import expect_error
from reference import assert_close_to_ref, same_dtype_ref
from serving_reference import attention_with_kvcache_serving_ref


def cache_batch(B, capacity=4096, Hq=8, Hkv=2, D=64, dtype=torch.bfloat16, tq=1):
    torch.manual_seed(7)
    kc, vc = (torch.randn(B, capacity, Hkv, D, dtype=dtype) for _ in range(2))
    q = torch.randn(B, tq, Hq, D, dtype=dtype)
    lens = torch.randint(capacity // 2, capacity + 1, (B,), dtype=torch.int32)
    return q, kc, vc, lens


@pytest.mark.parametrize("num_splits", [0, 1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_num_splits_results(num_splits, dtype):
    # one long row (split by default on 2 threads) and a few short ones
    q, kc, vc, lens = cache_batch(3, dtype=dtype)
    out, lse = attn_ops.attention_with_kvcache(q, kc, vc, lens, num_splits=num_splits)
    ref = attention_with_kvcache_serving_ref(q, kc, vc, lens)
    same = same_dtype_ref(attention_with_kvcache_serving_ref, q, kc, vc, lens, compute_dtype=dtype)
    assert_close_to_ref(out, ref[0], same[0], name="out")
    assert_close_to_ref(lse, ref[1], same[1], name="lse")


@pytest.mark.parametrize("layout", ["bshd", "heads_major", "paged16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_num_splits_one_makes_decode_rows_batch_invariant(layout, dtype):
    """Row 0 alone and inside batches of 2 and 8 (whose rows change how the work is split when splits are
    automatic): the same bits with num_splits=1."""
    q, kc, vc, lens = cache_batch(8, dtype=dtype)
    if layout == "heads_major":  # [B, Hkv, T, D] storage, as transformers' caches
        kc, vc = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (kc, vc))
    kw = {}
    if layout == "paged16":
        blocks = kc.shape[1] // 16
        table = torch.randperm(8 * blocks).to(torch.int32).view(8, blocks)
        pool_k, pool_v = (torch.empty(8 * blocks, 16, *kc.shape[2:], dtype=dtype) for _ in range(2))
        pool_k[table.flatten().long()] = kc.reshape(-1, 16, *kc.shape[2:])
        pool_v[table.flatten().long()] = vc.reshape(-1, 16, *vc.shape[2:])
        kc, vc, kw = pool_k, pool_v, dict(block_table=table)

    def row0(batch):
        sub = {n: t[:batch] for n, t in kw.items()}
        k_rows = kc if layout == "paged16" else kc[:batch]
        v_rows = vc if layout == "paged16" else vc[:batch]
        out, lse = attn_ops.attention_with_kvcache(q[:batch], k_rows, v_rows, lens[:batch], num_splits=1, **sub)
        return out[0], lse[0]

    alone = row0(1)
    for batch in (2, 8):
        out, lse = row0(batch)
        assert torch.equal(out, alone[0]) and torch.equal(lse, alone[1]), batch


def test_num_splits_must_not_be_negative():
    q, kc, vc, lens = cache_batch(1, capacity=32)
    expect_error("attention_with_kvcache", "num_splits must be >= 0 (0: automatic, 1: no split), got -1",
                 q, kc, vc, lens, num_splits=-1, exact=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deterministic_backward_repeats_bit_for_bit(dtype):
    """The CPU backward is deterministic with or without the flag, and with PyTorch's global switch."""
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 300, h, 64, dtype=dtype, requires_grad=True) for h in (8, 2, 2))
    dout = torch.randn(1, 300, 8, 64, dtype=dtype)

    def grads(**kw):
        out, _ = attn_ops.attention(q, k, v, causal=True, **kw)
        return torch.autograd.grad(out, (q, k, v), dout)

    first = grads(deterministic=True)
    for again in (grads(deterministic=True), grads(deterministic=False), grads()):
        assert all(torch.equal(a, b) for a, b in zip(first, again))
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert all(torch.equal(a, b) for a, b in zip(first, grads()))
    finally:
        torch.use_deterministic_algorithms(previous)


def test_flash_attn_functions_pass_them_on():
    from attn_ops import flash_attn3_interface as fa3
    from attn_ops.flash_attn_interface import flash_attn_func, flash_attn_with_kvcache
    q, kc, vc, lens = cache_batch(2, capacity=64, dtype=torch.float32)
    ours = attn_ops.attention_with_kvcache(q, kc, vc, lens, causal=True, num_splits=1)[0]
    assert torch.equal(flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True, num_splits=1), ours)
    assert torch.equal(fa3.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True, num_splits=1), ours)
    x = torch.randn(1, 40, 4, 32, requires_grad=True)
    out = flash_attn_func(x, x, x, causal=True, deterministic=True)
    assert torch.equal(out, attn_ops.attention(x, x, x, causal=True)[0])
    out.sum().backward()


def test_opcheck_and_compile():
    q, kc, vc, lens = cache_batch(2, capacity=64, dtype=torch.float32)
    opcheck(torch.ops.attn_ops.attention_with_kvcache.default, (q, kc, vc, lens), dict(num_splits=1))
    x = torch.randn(1, 24, 4, 16, requires_grad=True)
    opcheck(torch.ops.attn_ops.attention.default, (x, x, x), dict(causal=True, deterministic=True))
    out, lse = attn_ops.attention(x, x, x, causal=True)
    opcheck(torch.ops.attn_ops.attention_backward.default,
            (torch.randn_like(out), x.detach(), x.detach(), x.detach(), out.detach(), lse.detach()),
            dict(causal=True, deterministic=True))

    def step(q, k, v, kc, vc, lens):
        out, _ = torch.ops.attn_ops.attention(q, k, v, causal=True, deterministic=True)
        decode, _ = torch.ops.attn_ops.attention_with_kvcache(q[:, -1:].detach(), kc, vc, lens, num_splits=1)
        return out.sum() + decode.sum()

    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for T in (17, 29):
        inputs = [torch.randn(2, T, h, 64, requires_grad=True) for h in (8, 2, 2)]
        grads = torch.autograd.grad(compiled(*inputs, kc, vc, lens), inputs)
        expected = torch.autograd.grad(step(*inputs, kc, vc, lens), inputs)
        for a, b in zip(grads, expected):
            torch.testing.assert_close(a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_cuda_deterministic_backward_and_unsplit_decode():
    """On CUDA: deterministic=True repeats the backward bit for bit (row kernels, no atomics); num_splits=1 keeps a
    decode row's bits whatever its batch."""
    torch.manual_seed(5)
    q, k, v = (torch.randn(2, 512, h, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for h in (8, 2, 2))
    dout = torch.randn(2, 512, 8, 128, device="cuda", dtype=torch.bfloat16)

    def grads():
        out, _ = attn_ops.attention(q, k, v, causal=True, deterministic=True)
        return torch.autograd.grad(out, (q, k, v), dout)

    first = grads()
    assert all(torch.equal(a, b) for a, b in zip(first, grads()))
    qd, kc, vc, lens = (t.cuda() for t in cache_batch(8, capacity=8192))
    alone = attn_ops.attention_with_kvcache(qd[:1], kc[:1], vc[:1], lens[:1], num_splits=1)
    batched = attn_ops.attention_with_kvcache(qd, kc, vc, lens, num_splits=1)
    assert torch.equal(batched[0][0], alone[0][0]) and torch.equal(batched[1][0], alone[1][0])
