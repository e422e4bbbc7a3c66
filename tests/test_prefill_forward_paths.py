"""The CPU prefill forward's fast paths against the float64 reference, on every path this CPU can run.

The forward's softmax takes a polynomial exp (exp_no_nan) once a row's max is finite, and the AVX-512 copy
rounds the bfloat16 probabilities with AVX512-BF16's instruction where the CPU has it (else in integer
arithmetic). ATTN_OPS_CPU_ISA picks the copy, ATTN_OPS_CPU_AVX512BF16=0 turns AVX512-BF16 off and
ATTN_OPS_CPU_AMX=0 turns AMX off, all read at every call, so each path runs here: portable, AVX2, AVX-512
with and without AVX512-BF16, and AVX512-BF16 without AMX.
Head dim 128 with bfloat16 / float16 takes brgemm (AMX) in the AVX-512 copy where the CPU has it; bfloat16
on AVX512-BF16 without AMX takes the panel micro-kernel on bfloat16 pairs (vdpbf16ps) once a sequence has
>= 64 query rows, Dqk is even and Dv a multiple of 32 (the "avx512_bf16" path on such a CPU,
"avx512_bf16_noamx" on any AVX512-BF16 CPU); float32 takes the register-blocked panel micro-kernel
(gemm_kernels.h) in the AVX-512 and AVX2 copies once a sequence has >= 64 query rows (positions x group
heads) and Dv is a multiple of the panel width (32 / 16), else MKL's sgemm: the cases below cover both
sides, row counts off the 14 / 6-row blocks, key counts off the 32 / 16-key panels and odd key counts
(the bfloat16 pairs' zero key).
"""

import pytest
import torch

import attn_ops
from cpu_isa_helpers import force_isa
from kvcache_reference import attention_with_kvcache_ref, kvcache_inputs
from reference import (assert_attention_close_to_ref, assert_close_to_ref, dense_inputs, same_dtype_ref,
                       varlen_inputs)

PATHS = ["default", "avx2", "avx512", "avx512_bf16", "avx512_bf16_noamx"]


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    force_isa(monkeypatch, "avx512" if request.param.startswith("avx512") else request.param)
    # avx512_bf16* use AVX512-BF16 only where the CPU has it; plain avx512 never does.
    monkeypatch.setenv("ATTN_OPS_CPU_AVX512BF16", "1" if request.param.startswith("avx512_bf16") else "0")
    monkeypatch.setenv("ATTN_OPS_CPU_AMX", "0" if request.param == "avx512_bf16_noamx" else "1")
    return request.param


DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def dtype_id(d):
    return str(d).replace("torch.", "")


# Lengths around the 64-key packing block and the 256-key tile; GQA groups 1, 4 and all (Hq = 8).
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
# (Length 1 with group 1 is a decode-shaped call, which routes to the decode kernel: 2 is the shortest here.)
@pytest.mark.parametrize("length, hkv", [(2, 8), (17, 2), (63, 1), (64, 8), (65, 2), (257, 1), (300, 2)])
def test_causal_lengths_and_groups(path, dtype, length, hkv):
    q, k, v = dense_inputs(1, length, length, 8, hkv, 128, 128, dtype, "cpu")
    assert_attention_close_to_ref(attn_ops.attention(q, k, v, causal=True), (q, k, v), causal=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("kw", [dict(), dict(window_left=40, window_right=0), dict(softcap=10.0),
                                dict(causal=True, scale=0.3)], ids=["full", "window", "softcap", "scale"])
def test_options(path, dtype, kw):
    q, k, v = dense_inputs(2, 65, 257, 8, 2, 128, 128, dtype, "cpu")
    assert_attention_close_to_ref(attn_ops.attention(q, k, v, **kw), (q, k, v), **kw)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_varlen_with_empty_sequence(path, dtype):
    q, k, v, cu_q, cu_k = varlen_inputs([63, 0, 1, 130], [257, 5, 17, 130], 8, 2, 128, 128, dtype, "cpu")
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
    assert_attention_close_to_ref(attn_ops.attention(q, k, v, **kw), (q, k, v), **kw)


def test_large_logits(path):
    """Scores of a few hundred: the max shift keeps exp in range on every path."""
    for dtype in DTYPES:
        q, k, v = dense_inputs(1, 70, 300, 4, 2, 128, 128, dtype, "cpu")
        q = q * 30
        assert_attention_close_to_ref(attn_ops.attention(q, k, v, causal=True), (q, k, v), causal=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_nan_and_inf_scores_give_nan_rows(path, dtype, value):
    """A NaN or +inf score makes its row's max non-finite: that row takes the exact exp and ends NaN (as the
    reference: inf - inf), the other rows stay finite."""
    q, k, v = dense_inputs(1, 70, 300, 4, 2, 128, 128, dtype, "cpu")
    q[0, 50, 1] = 0.0
    q[0, 50, 1, 7] = value
    k[0, :, 0, 7] = k[0, :, 0, 7].abs() + 0.5  # every score of that row is NaN / +inf
    out, lse = attn_ops.attention(q, k, v, causal=True)
    assert torch.isnan(out[0, 50, 1]).all() and torch.isnan(lse[0, 1, 50])
    rest = torch.ones(70, 4, dtype=torch.bool)
    rest[50, 1] = False
    assert torch.isfinite(out[0][rest]).all() and torch.isfinite(lse[0].T[rest]).all()


# (Dqk, Dv): the specialized head dims; 80 is off the AVX-512 panel width (MKL there, panels on AVX2);
# an odd Dqk has no whole bfloat16 pairs (converted to float32 there).
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("dims", [(64, 64), (96, 96), (192, 128), (256, 256), (80, 80), (63, 64)], ids=str)
def test_head_dims(path, dtype, dims):
    q, k, v = dense_inputs(1, 65, 97, 8, 2, dims[0], dims[1], dtype, "cpu")
    for kw in (dict(causal=True), dict()):
        assert_attention_close_to_ref(attn_ops.attention(q, k, v, **kw), (q, k, v), **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("block_size", [16, 48])
def test_paged_cache_prefill(path, dtype, block_size):
    """Chunked prefill over a paged cache: key panels and tiles that cross cache blocks are gathered."""
    q, kc, vc, sl, bt = kvcache_inputs(3, 40, 8, 2, 128, 128, [40, 100, 300], dtype=dtype, block_size=block_size)
    out, lse = attn_ops.attention_with_kvcache(q, kc, vc, sl, block_table=bt)
    r_out, r_lse = attention_with_kvcache_ref(q, kc, vc, sl, block_table=bt)
    s_out, s_lse = same_dtype_ref(attention_with_kvcache_ref, q, kc, vc, sl, block_table=bt,
                                  compute_dtype=dtype)
    assert_close_to_ref(out, r_out, s_out, name="out")
    assert_close_to_ref(lse, r_lse, s_lse, name="lse")
