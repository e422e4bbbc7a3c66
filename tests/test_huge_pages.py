"""attn_ops._huge_pages.zeros: zeros like torch.zeros, and on Linux CPU memory that the kernel backs with
transparent huge pages (what the nn cache modules allocate their CPU storage with)."""
import os
import sys

import pytest
import torch

import attn_ops
from attn_ops import _huge_pages

THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def thp_available():
    if not sys.platform.startswith("linux") or not os.path.exists(THP_SETTING):
        return False
    with open(THP_SETTING) as f:
        return "[never]" not in f.read()


def anon_huge_kib(address):
    """AnonHugePages (KiB) of the mapping of this process that holds `address`, from /proc/self/smaps."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split()[0]
            if "-" in first and not first.endswith(":"):
                lo, hi = (int(x, 16) for x in first.split("-"))
                inside = lo <= address < hi
            elif inside and first == "AnonHugePages:":
                return int(line.split()[1])
    raise AssertionError(f"no mapping holds address {address:#x}")


@pytest.mark.parametrize("shape,dtype", [((3, 5), torch.float32), ((2, 4096, 8, 128), torch.bfloat16),
                                         ((1, 3 << 20), torch.float16)], ids=["small", "cache_bf16", "odd_f16"])
def test_zeros_are_zeros(shape, dtype):
    t = _huge_pages.zeros(*shape, dtype=dtype, device="cpu")
    assert t.shape == shape and t.dtype == dtype and t.device.type == "cpu" and t.is_contiguous()
    assert not t.any()


def test_zeros_without_device_follow_the_default_device():
    # as torch.zeros: device=None is the default device, not the CPU
    torch.set_default_device("meta")
    try:
        t = _huge_pages.zeros(2, 3, dtype=torch.float32, device=None)
        cache = attn_ops.nn.KVCache(1, 2, 8, 2, 4)
    finally:
        torch.set_default_device(None)
    assert t.device.type == "meta" and t.shape == (2, 3)
    assert all(x.device.type == "meta" for x in cache._storage() + [cache.seqlens])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_zeros_on_cuda_is_plain():
    t = _huge_pages.zeros(4, 1 << 20, dtype=torch.float16, device="cuda")
    assert t.device.type == "cuda" and not t.any()


# Over 32 MiB (glibc's largest mmap threshold) an allocation is fresh memory, which the advice alone turns
# into huge pages on any kernel with THP; smaller ones may reuse heap memory, collapsed only on Linux 6.1+.
@pytest.mark.skipif(not thp_available(), reason="transparent huge pages are off or absent (not Linux)")
def test_large_zeros_are_backed_by_huge_pages():
    t = _huge_pages.zeros(40 << 20, dtype=torch.uint8, device="cpu")
    assert anon_huge_kib(t.data_ptr() + (20 << 20)) >= 2048
    assert not t.any()
    with open(THP_SETTING) as f:
        madvise_only = "[madvise]" in f.read()
    if madvise_only:  # the usual setting, where only advised memory gets huge pages: what the check tells apart
        plain = torch.zeros(40 << 20, dtype=torch.uint8)
        plain.fill_(1)
        assert anon_huge_kib(plain.data_ptr() + (20 << 20)) == 0


@pytest.mark.skipif(not thp_available(), reason="transparent huge pages are off or absent (not Linux)")
def test_cpu_kv_cache_storage_uses_huge_pages():
    cache = attn_ops.nn.KVCache(1, 12, 2048, 8, 128, dtype=torch.bfloat16)  # 48 MiB per K and V tensor
    for t in cache._storage():
        assert anon_huge_kib(t.data_ptr() + t.nbytes // 2) >= 2048
        assert not t.any()
