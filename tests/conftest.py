"""Shared pytest configuration for the attn_ops tests.

- `device` fixture: every test that takes it runs on "cpu", and on "cuda" when a GPU is available
  (otherwise the cuda case is collected and skipped with a reason).
- Every test gets its own deterministic seed, derived from its node id, so each case draws fresh
  random inputs and a failure reproduces when the test is run alone.
"""

import zlib

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="CUDA is not available")),
]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(autouse=True)
def _seed_per_test(request):
    seed = zlib.crc32(request.node.nodeid.encode()) & 0x7FFFFFFF
    torch.manual_seed(seed)
    yield seed


# Tests marked `host_value_check` assert, in-process, the RuntimeError of a bad index value (a length,
# slot, block-table entry, position or cu_seqlens entry). On CUDA those values are checked on the device
# by a kernel that fails a device-side assert (csrc/common/cuda/index_checks.h), which ends the process's
# CUDA context: their CUDA cases run in child processes in test_cuda_device_checks.py instead, and are
# skipped here.
def pytest_configure(config):
    config.addinivalue_line("markers", "host_value_check: asserts a bad-value error in-process (CPU only)")


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="CUDA checks index values on the device (device-side assert): "
                                   "see test_cuda_device_checks.py")
    for item in items:
        callspec = getattr(item, "callspec", None)
        if item.get_closest_marker("host_value_check") and callspec is not None \
                and callspec.params.get("device") == "cuda":
            item.add_marker(skip)
