"""cuDNN's fused-attention graphs of the calls the CUDA router sends to cuDNN, validated for compute capability 9.0
against the libcudnn installed with torch, without a GPU (the test hook torch.ops.attn_ops._cudnn_validate_attention:
the call prepared by the op's own preparation from meta tensors, converted as the CUDA backend converts it, and
validated by cuDNN). Also the classes the router keeps on attn_ops' kernels that cuDNN itself refuses. The router's
own table is tests/cpp/test_backend_route.cpp; what ran on a GPU is docs/cuda.md's to say.

Runs in builds with the cuDNN backend (a CUDA build that found the cudnn-frontend headers: CI's).
"""
import pytest
import torch

HOOK = "attn_ops::_cudnn_validate_attention"
pytestmark = pytest.mark.skipif(
    not torch._C._dispatch_has_kernel_for_dispatch_key(HOOK, "CompositeExplicitAutograd"),
    reason="this build has no cuDNN backend (a CPU-only build, or no cudnn-frontend headers at build time)")

BF16, F16 = torch.bfloat16, torch.float16


def meta(*shape, dtype=BF16):
    return torch.empty(shape, device="meta", dtype=dtype)


def dense(B=2, tq=256, tk=256, hq=8, hkv=2, dqk=128, dv=128, dtype=BF16):
    return meta(B, tq, hq, dqk, dtype=dtype), meta(B, tk, hkv, dqk, dtype=dtype), meta(B, tk, hkv, dv, dtype=dtype)


def bhsd_views(B=2, T=256, hq=8, hkv=2, d=128):
    """q / k / v as the [B, S, H, D] views of [B, H, S, D] tensors (transformers' layout)."""
    return (meta(B, hq, T, d).transpose(1, 2), meta(B, hkv, T, d).transpose(1, 2), meta(B, hkv, T, d).transpose(1, 2))


def cache(tq, block=None, B=4, capacity=256, hkv=2, d=128):
    q = meta(B, tq, 8, d)
    lens = meta(B, dtype=torch.int32)
    if block is None:
        kc = meta(B, capacity, hkv, d)
        return (q, kc, kc), dict(cache_seqlens=lens)
    kc = meta(B * capacity // block, block, hkv, d)
    return (q, kc, kc), dict(cache_seqlens=lens, block_table=meta(B, capacity // block, dtype=torch.int32))


def validate(args, **kw):
    return torch.ops.attn_ops._cudnn_validate_attention(*args, **kw)


# Every class of call the router sends to cuDNN (backend_route.cpp), forward and (dense) backward.
DENSE = {
    "causal_gqa_d128": (dense(), dict(causal=True)),
    "causal_window": (dense(), dict(causal=True, window_left=127)),
    "two_sided_window": (dense(), dict(window_left=31, window_right=16)),
    "unmasked_more_queries": (dense(tq=300, tk=200), dict()),
    "causal_fewer_queries": (dense(tq=64, tk=256), dict(causal=True)),
    "mqa_d64_f16": (dense(hkv=1, dqk=64, dv=64, dtype=F16), dict(causal=True)),
    "d96": (dense(dqk=96, dv=96), dict(causal=True)),
    "d256": (dense(dqk=256, dv=256), dict(causal=True)),
    "deepseek_192_128": (dense(dqk=192, dv=128), dict(causal=True)),
    "bhsd_views": (bhsd_views(), dict(causal=True)),
}
CACHES = {
    "contiguous_decode": cache(1),
    "contiguous_chunked_prefill": cache(16),
    "paged16_decode": cache(1, 16),
    "paged64_chunked_prefill": cache(32, 64),
}


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("name", list(DENSE))
def test_dense_calls_validate(name, backward):
    args, kw = DENSE[name]
    assert validate(args, backward=backward, **kw) == ""


@pytest.mark.parametrize("name", list(CACHES))
def test_cache_forwards_validate(name):
    args, kw = CACHES[name]
    assert validate(args, causal=True, **kw) == ""


def test_refused_classes_stay_refused():
    """Calls the router keeps on attn_ops' kernels because cuDNN refuses them: more queries than keys under a
    causal mask, MLA's 576 / 512 head dims in the backward."""
    assert validate(dense(tq=300, tk=200), causal=True) != ""
    assert validate(dense(hkv=1, dqk=576, dv=512), causal=True, backward=True) != ""


def test_hook_reports_bad_calls_as_the_op_does():
    with pytest.raises(RuntimeError, match="attn_ops.attention: k must have head_dim_qk 128 "):
        validate((meta(2, 8, 4, 128), meta(2, 8, 2, 64), meta(2, 8, 2, 128)))
