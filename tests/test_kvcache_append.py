"""kv_cache_append and paged_kv_cache_append against plain-indexing references
(tests/kvcache_reference.py).

A copy is exact: every check compares bits, over the whole buffer each cache lives in (so a write to
the wrong entry, to the padding of a strided view, or to the other cache is caught too).
"""

import pytest
import torch

import attn_ops
from kvcache_reference import (cache_pair, kv_cache_append_ref_, paged_kv_cache_append_ref_,
                               shuffled_block_table, slots_for, twin)
from reference import make_bshd, make_thd

ALL_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def dtype_id(dt):
    return str(dt).replace("torch.", "")


def assert_buffers_equal(bufs, expected):
    for i, (got, exp) in enumerate(zip(bufs, expected)):
        assert got.dtype == exp.dtype and got.shape == exp.shape
        if not torch.equal(got, exp):
            bad = (got != exp).nonzero()
            raise AssertionError(
                f"buffer {i}: {bad.shape[0]} entries differ from the expected cache "
                f"(first at {tuple(bad[0].tolist())})")


def check_append(k_cache, v_cache, bufs, k, v, seqlens):
    """Run kv_cache_append and compare every buffer with the reference applied to a copy."""
    exp_bufs = [b.clone() for b in bufs]
    ek = twin(k_cache, bufs[0], exp_bufs[0])
    ev = twin(v_cache, bufs[-1], exp_bufs[-1])
    kv_cache_append_ref_(ek, ev, k, v, seqlens)
    inputs = [t.clone() for t in (k, v, seqlens)]
    ptrs = (k_cache.data_ptr(), v_cache.data_ptr())
    res = attn_ops.kv_cache_append(k_cache, v_cache, k, v, seqlens)
    assert res is None
    assert (k_cache.data_ptr(), v_cache.data_ptr()) == ptrs
    for t, b in zip((k, v, seqlens), inputs):
        assert torch.equal(t, b), "the op modified an input (cache_seqlens is the caller's)"
    assert_buffers_equal(bufs, exp_bufs)


def check_paged_append(k_cache, v_cache, bufs, k, v, slots):
    exp_bufs = [b.clone() for b in bufs]
    ek = twin(k_cache, bufs[0], exp_bufs[0])
    ev = twin(v_cache, bufs[-1], exp_bufs[-1])
    paged_kv_cache_append_ref_(ek, ev, k, v, slots)
    inputs = [t.clone() for t in (k, v, slots)]
    res = attn_ops.paged_kv_cache_append(k_cache, v_cache, k, v, slots)
    assert res is None
    for t, b in zip((k, v, slots), inputs):
        assert torch.equal(t, b), "the op modified an input"
    assert_buffers_equal(bufs, exp_bufs)


def contiguous_caches(B, cap, H, Dk, Dv, dtype, device, layout="contiguous"):
    kx = torch.randn(B, cap, H, Dk, dtype=dtype, device=device)
    vx = torch.randn(B, cap, H, Dv, dtype=dtype, device=device)
    return cache_pair(kx, vx, layout)


# --------------------------------------------------------------------------------------------------
# Contiguous cache
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tnew", [0, 1, 5])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_append_contiguous(dtype, tnew, device):
    cap = 32
    # rows of different lengths; the last row is filled exactly (to the capacity)
    lens = [0, 7, 19, cap - tnew]
    B, H, Dk, Dv = len(lens), 2, 64, 32
    k_cache, v_cache, bufs = contiguous_caches(B, cap, H, Dk, Dv, dtype, device)
    k = make_bshd(B, tnew, H, Dk, dtype=dtype, device=device)
    v = make_bshd(B, tnew, H, Dv, dtype=dtype, device=device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    check_append(k_cache, v_cache, bufs, k, v, seqlens)


@pytest.mark.parametrize("cache_layout", ["transposed", "sliced", "kv_fused"])
@pytest.mark.parametrize("kv_layout", ["contiguous", "transposed", "sliced", "expanded"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_append_contiguous_views(dtype, kv_layout, cache_layout, device):
    cap, lens, H, D, tnew = 24, [3, 0, 19], 4, 32, 5
    B = len(lens)
    k_cache, v_cache, bufs = contiguous_caches(B, cap, H, D, D, dtype, device, cache_layout)
    assert not k_cache.is_contiguous()
    k = make_bshd(B, tnew, H, D, dtype=dtype, device=device, layout=kv_layout)
    v = make_bshd(B, tnew, H, D, dtype=dtype, device=device, layout=kv_layout)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    check_append(k_cache, v_cache, bufs, k, v, seqlens)


def test_append_full_cache_zero_new(device):
    # cache_seqlens == capacity with Tnew = 0 is valid and writes nothing
    k_cache, v_cache, bufs = contiguous_caches(2, 8, 2, 16, 16, torch.float32, device)
    k = torch.randn(2, 0, 2, 16, device=device)
    v = torch.randn(2, 0, 2, 16, device=device)
    check_append(k_cache, v_cache, bufs, k, v, torch.tensor([8, 8], dtype=torch.int32,
                                                            device=device))


def test_append_capacity_one_and_big_heads(device):
    k_cache, v_cache, bufs = contiguous_caches(3, 1, 16, 8, 24, torch.bfloat16, device)
    k = torch.randn(3, 1, 16, 8, dtype=torch.bfloat16, device=device)
    v = torch.randn(3, 1, 16, 24, dtype=torch.bfloat16, device=device)
    check_append(k_cache, v_cache, bufs, k, v, torch.zeros(3, dtype=torch.int32, device=device))


def test_append_noncontiguous_seqlens(device):
    k_cache, v_cache, bufs = contiguous_caches(3, 16, 2, 16, 16, torch.float32, device)
    k = torch.randn(3, 2, 2, 16, device=device)
    v = torch.randn(3, 2, 2, 16, device=device)
    seqlens = torch.tensor([4, 99, 0, 99, 14, 99], dtype=torch.int32, device=device)[::2]
    check_append(k_cache, v_cache, bufs, k, v, seqlens)


def test_append_step_by_step_builds_the_sequence(device):
    """Appending chunks step by step (the caller advancing cache_seqlens) gives the concatenation."""
    B, cap, H, D = 3, 40, 2, 16
    k_cache = torch.randn(B, cap, H, D, device=device)
    v_cache = torch.randn(B, cap, H, D, device=device)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    seqlens = torch.zeros(B, dtype=torch.int32, device=device)
    ks, vs = [], []
    for t in (5, 1, 1, 0, 7, 1):
        k = torch.randn(B, t, H, D, device=device)
        v = torch.randn(B, t, H, D, device=device)
        attn_ops.kv_cache_append(k_cache, v_cache, k, v, seqlens)
        seqlens += t
        ks.append(k)
        vs.append(v)
    n = int(seqlens[0])
    assert torch.equal(k_cache[:, :n], torch.cat(ks, 1))
    assert torch.equal(v_cache[:, :n], torch.cat(vs, 1))
    assert torch.equal(k_cache[:, n:], before_k[:, n:])
    assert torch.equal(v_cache[:, n:], before_v[:, n:])


def test_append_torch_ops_path(device):
    k_cache, v_cache, bufs = contiguous_caches(2, 8, 2, 16, 16, torch.float32, device)
    k = torch.randn(2, 3, 2, 16, device=device)
    v = torch.randn(2, 3, 2, 16, device=device)
    seqlens = torch.tensor([1, 5], dtype=torch.int32, device=device)
    exp_bufs = [b.clone() for b in bufs]
    kv_cache_append_ref_(exp_bufs[0], exp_bufs[1], k, v, seqlens)
    assert torch.ops.attn_ops.kv_cache_append(k_cache, v_cache, k, v, seqlens) is None
    assert_buffers_equal(bufs, exp_bufs)


# --------------------------------------------------------------------------------------------------
# Paged cache
# --------------------------------------------------------------------------------------------------
def paged_setup(block_size, lens, tnews, H, Dk, Dv, dtype, device, layout="contiguous",
                skip_every=0, slot_dtype=torch.int32, shuffle_tokens=True):
    """Paged caches with shuffled blocks, and the tokens of a step that appends tnews[b] tokens to
    row b (currently lens[b] long). Returns (k_cache, v_cache, bufs, k, v, slots)."""
    B = len(lens)
    need = max(l + t for l, t in zip(lens, tnews))
    mb = max(1, -(-need // block_size))
    nb = B * mb + 2
    bt = shuffled_block_table(B, mb, nb)
    kx = torch.randn(nb, block_size, H, Dk, dtype=dtype, device=device)
    vx = torch.randn(nb, block_size, H, Dv, dtype=dtype, device=device)
    k_cache, v_cache, bufs = cache_pair(kx, vx, layout)
    pairs = [(b, lens[b] + t) for b in range(B) for t in range(tnews[b])]
    slots = slots_for(bt, block_size, pairs)
    if shuffle_tokens:
        slots = [slots[i] for i in torch.randperm(len(slots)).tolist()]
    if skip_every:
        slots = [-1 if i % skip_every == 1 else s for i, s in enumerate(slots)]
    N = len(slots)
    k = torch.randn(N, H, Dk, dtype=dtype, device=device)
    v = torch.randn(N, H, Dv, dtype=dtype, device=device)
    return k_cache, v_cache, bufs, k, v, torch.tensor(slots, dtype=slot_dtype, device=device)


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64], ids=dtype_id)
@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_append_paged(dtype, block_size, slot_dtype, device):
    # rows of different lengths; prefill-like (many tokens), decode-like (one) and empty steps;
    # tokens in shuffled order; every third token skipped with slot -1
    lens, tnews = [0, 5, 63, 17], [20, 1, 2, 0]
    k_cache, v_cache, bufs, k, v, slots = paged_setup(
        block_size, lens, tnews, 2, 64, 32, dtype, device, skip_every=3, slot_dtype=slot_dtype)
    assert (slots == -1).any() and (slots >= 0).any()
    check_paged_append(k_cache, v_cache, bufs, k, v, slots)


@pytest.mark.parametrize("cache_layout", ["transposed", "sliced", "kv_fused"])
@pytest.mark.parametrize("kv_layout", ["contiguous", "transposed", "sliced"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_append_paged_views(dtype, kv_layout, cache_layout, device):
    k_cache, v_cache, bufs, k, v, slots = paged_setup(
        16, [3, 30], [9, 4], 4, 32, 32, dtype, device, layout=cache_layout, skip_every=4)
    assert not k_cache.is_contiguous()
    k = make_thd(k.shape[0], 4, 32, dtype=dtype, device=device, layout=kv_layout)
    v = make_thd(v.shape[0], 4, 32, dtype=dtype, device=device, layout=kv_layout)
    check_paged_append(k_cache, v_cache, bufs, k, v, slots)


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64], ids=dtype_id)
def test_append_paged_all_skipped_and_empty(slot_dtype, device):
    k_cache, v_cache, bufs, k, v, slots = paged_setup(16, [3, 4], [2, 3], 2, 16, 16,
                                                      torch.float32, device,
                                                      slot_dtype=slot_dtype)
    check_paged_append(k_cache, v_cache, bufs, k, v, torch.full_like(slots, -1))
    check_paged_append(k_cache, v_cache, bufs, k[:0], v[:0], slots[:0])


def test_append_paged_last_slot_and_block_size_one(device):
    # the very first and very last slots of the cache; block size 1 (slot == block)
    for bs in (1, 16):
        nb = 5
        kx = torch.randn(nb, bs, 2, 8, device=device)
        vx = torch.randn(nb, bs, 2, 8, device=device)
        k_cache, v_cache, bufs = cache_pair(kx, vx)
        slots = torch.tensor([nb * bs - 1, 0, -1], dtype=torch.int64, device=device)
        k = torch.randn(3, 2, 8, device=device)
        v = torch.randn(3, 2, 8, device=device)
        check_paged_append(k_cache, v_cache, bufs, k, v, slots)


def test_append_paged_noncontiguous_slots(device):
    k_cache, v_cache, bufs, k, v, slots = paged_setup(16, [3, 40], [5, 6], 2, 16, 16,
                                                      torch.float32, device)
    spread = torch.full((2 * slots.numel(),), 12345, dtype=slots.dtype, device=device)
    spread[::2] = slots
    check_paged_append(k_cache, v_cache, bufs, k, v, spread[::2])


def test_paged_append_torch_ops_path(device):
    k_cache, v_cache, bufs, k, v, slots = paged_setup(16, [3, 40], [5, 6], 2, 16, 16,
                                                      torch.float32, device)
    exp_bufs = [b.clone() for b in bufs]
    paged_kv_cache_append_ref_(exp_bufs[0], exp_bufs[1], k, v, slots)
    assert torch.ops.attn_ops.paged_kv_cache_append(k_cache, v_cache, k, v, slots) is None
    assert_buffers_equal(bufs, exp_bufs)
