"""The low-precision backward's packed-product path against the float64 reference: bfloat16 in the
AVX-512 copy on a CPU with AMX (brgemm) or AVX512-BF16 (the same packed operands on bfloat16 pairs,
vdpbf16ps).

That path needs Dqk a multiple of 64: these cases use D = 64 / 128 so that bfloat16 takes it (float16 runs
the float32 tile path; its cases check the same shapes). Lengths cross the backward's 256-key block and
64-key pack block (1, 17, 63, 64, 65, 257), GQA groups 1 / 4 / all, causal / window / softcap, varlen with
empty sequences. Every case runs on four settings (read at every call): "best" (AMX where the CPU has it,
else pairs where it has AVX512-BF16), "pairs" (ATTN_OPS_CPU_AMX=0: pairs on any AVX512-BF16 CPU),
"float32" (AMX and AVX512-BF16 off: the float32 tile path on every AVX-512 CPU) and "default" (the
portable copy, which never takes packed products; float32 there: the key-split tile path).
"""

import pytest
import torch

import attn_ops
from reference import dense_inputs, varlen_inputs
from test_attention_backward import check_backward

LOWP = [torch.bfloat16, torch.float16]


@pytest.fixture(params=["best", "pairs", "float32", "default"])
def isa(request, monkeypatch):
    if request.param == "default":
        monkeypatch.setenv("ATTN_OPS_CPU_ISA", "default")
    monkeypatch.setenv("ATTN_OPS_CPU_AMX", "1" if request.param == "best" else "0")
    monkeypatch.setenv("ATTN_OPS_CPU_AVX512BF16", "0" if request.param == "float32" else "1")
    return request.param


def dtype_id(dt):
    return str(dt).replace("torch.", "")


@pytest.mark.parametrize("t", [1, 17, 63, 64, 65, 257])
@pytest.mark.parametrize("dtype", LOWP, ids=dtype_id)
def test_lengths_causal_gqa4(isa, dtype, t):
    q, k, v = dense_inputs(1, t, t, 8, 2, 64, 64, dtype, "cpu")
    check_backward(q, k, v, causal=True)


# (Tq, Tk, Hq, Hkv, D, kwargs)
CASES = {
    "mha_full_dlse": (65, 129, 4, 4, 64, {}),
    "mqa_causal_tq_lt_tk": (17, 257, 4, 1, 128, dict(causal=True)),
    "gqa4_window": (130, 130, 8, 2, 64, dict(window_left=40, window_right=3)),
    "gqa4_softcap": (63, 65, 8, 2, 128, dict(softcap=6.0, causal=True)),
    "all_negative_scale": (64, 63, 4, 1, 64, dict(scale=-0.1)),
    "rows_without_keys": (70, 20, 4, 2, 64, dict(causal=True)),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", LOWP, ids=dtype_id)
def test_cases(isa, dtype, case):
    tq, tk, hq, hkv, d, kw = CASES[case]
    q, k, v = dense_inputs(2, tq, tk, hq, hkv, d, d, dtype, "cpu")
    check_backward(q, k, v, **kw)


@pytest.mark.parametrize("dtype", LOWP, ids=dtype_id)
def test_dqk_ne_dv(isa, dtype):
    q, k, v = dense_inputs(1, 65, 65, 4, 2, 128, 64, dtype, "cpu")
    check_backward(q, k, v, causal=True)


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("dtype", LOWP, ids=dtype_id)
def test_varlen_empty_sequences(isa, dtype, layout):
    lens_q, lens_k = [17, 0, 65, 1, 130], [17, 9, 65, 0, 257]
    q, k, v, cq, ck = varlen_inputs(lens_q, lens_k, 8, 2, 64, 64, dtype, "cpu", layout)
    check_backward(q, k, v, causal=True, cu_seqlens_q=cq, cu_seqlens_k=ck)


def assert_bit_identical_reruns(q, k, v):
    """Two causal forward+backward runs on the same inputs give the same gradient bits."""
    dout = torch.randn_like(q)
    grads = []
    for _ in range(2):
        qs, ks, vs = (x.detach().requires_grad_() for x in (q, k, v))
        out, _ = attn_ops.attention(qs, ks, vs, causal=True)
        grads.append(torch.autograd.grad(out, (qs, ks, vs), dout))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_deterministic(isa):
    assert_bit_identical_reruns(*dense_inputs(1, 300, 300, 8, 2, 128, 128, torch.bfloat16, "cpu"))


# Query chunks (the brgemm path's unit of dQ, 2048 rows = positions x group heads; 128 positions at group
# 16, 256 at group 8) and their splits. (B, Tq, Tk, Hq, Hkv, kwargs); run at 4 threads, so that MQA at
# batch 1 splits its chunks (each split its own dK / dV, summed at the end) and the others do not.
CHUNK_CASES = {
    "mqa_g16_splits_causal": (1, 300, 300, 16, 1, dict(causal=True)),
    "mqa_g16_splits_window_tq_lt_tk": (1, 257, 520, 16, 1, dict(window_left=100, window_right=7)),
    "gqa8_chunks_softcap": (2, 600, 600, 16, 2, dict(softcap=6.0, causal=True)),
    "gqa8_chunks_full": (1, 513, 65, 16, 2, {}),
}


@pytest.fixture
def four_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("case", CHUNK_CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
def test_query_chunks(isa, four_threads, dtype, case):
    b, tq, tk, hq, hkv, kw = CHUNK_CASES[case]
    q, k, v = dense_inputs(b, tq, tk, hq, hkv, 64, 64, dtype, "cpu")
    check_backward(q, k, v, **kw)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
def test_query_chunks_varlen_empty_sequence(isa, four_threads, dtype):
    lens_q, lens_k = [300, 0, 257, 1], [300, 40, 257, 0]
    q, k, v, cq, ck = varlen_inputs(lens_q, lens_k, 16, 1, 128, 64, dtype, "cpu")
    check_backward(q, k, v, causal=True, cu_seqlens_q=cq, cu_seqlens_k=ck)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
def test_deterministic_with_splits(isa, four_threads, dtype):
    """MQA at batch 1 on 4 threads: the work is split (bfloat16 on brgemm: three query-chunk splits with
    their own dK / dV; float32: key splits with their own dQ), the splits summed in a fixed order."""
    assert_bit_identical_reruns(*dense_inputs(1, 300, 300, 16, 1, 64, 64, dtype, "cpu"))
