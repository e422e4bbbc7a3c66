"""Zero-filled CPU tensors backed by transparent huge pages (2 MiB) where Linux allows them.

A decode step reads one KV head's rows of the cache, which in the [batch, seqlen, heads, head_dim] layout are
kilobytes apart: with 4 KiB pages nearly every other row is a new page and a TLB miss. Linux's usual THP
setting (``madvise``) gives huge pages only to memory that asks for them, and PyTorch's CPU allocator asks
only under ``THP_MEM_ALLOC_ENABLE=1``. The cache modules of ``attn_ops.nn`` therefore ask for their CPU
storage: the decode kernel then reads the cache 7-24% faster on the Zen 4 machine measured
(``benchmarks/decode_huge_pages.py``). Elsewhere (not Linux, THP off, other devices, small tensors) this is
plain ``torch.zeros``.
"""
import ctypes
import sys

import torch

_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14  # huge pages at the next faults of the range
_MADV_COLLAPSE = 25  # Linux 6.1+: huge pages now, for memory already touched (reused heap memory)
_madvise = None


def _libc_madvise():
    global _madvise
    if _madvise is None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            libc.madvise.restype = ctypes.c_int
            _madvise = libc.madvise
        except (OSError, AttributeError):
            _madvise = False
    return _madvise


def resolve_device(device) -> torch.device:
    """The device ``torch.zeros(..., device=device)`` allocates on: ``device``, or for None the default
    device (``torch.set_default_device``, a ``with torch.device(...)`` block)."""
    return torch.device(device) if device is not None else torch.get_default_device()


def zeros(*shape, dtype: torch.dtype, device) -> torch.Tensor:
    """``torch.zeros(*shape, dtype=dtype, device=device)``; on Linux CPU, the whole 2 MiB pages inside a
    tensor of at least two of them are advised as huge pages before the zeros are written (allocations over
    32 MiB are fresh memory, mapped at that first write), then collapsed into huge pages where the kernel
    can (memory reused from the heap was touched before the advice)."""
    device = resolve_device(device)
    madvise = _libc_madvise() if device.type == "cpu" and sys.platform.startswith("linux") else False
    if not madvise:
        return torch.zeros(*shape, dtype=dtype, device=device)
    t = torch.empty(*shape, dtype=dtype, device=device)
    start = -(-t.data_ptr() // _HUGE_PAGE) * _HUGE_PAGE
    end = (t.data_ptr() + t.numel() * t.element_size()) // _HUGE_PAGE * _HUGE_PAGE
    if end - start < _HUGE_PAGE:
        return t.zero_()
    madvise(start, end - start, _MADV_HUGEPAGE)  # hints: a failure (THP off or absent) changes only speed
    t.zero_()
    madvise(start, end - start, _MADV_COLLAPSE)
    return t
