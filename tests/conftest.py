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
