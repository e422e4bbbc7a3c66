"""Each instruction-set copy of the CPU vector kernels against the float64 reference.

The library bakes no ISA flag into its build: the prefill forward / backward and the additive score loops
are compiled for portable code, AVX2 and AVX-512 (the additive loops for portable code and AVX2 only),
and the best copy the CPU has runs. ATTN_OPS_CPU_ISA
(read at every call) caps the choice, so every copy this CPU can run is tested here, in this process.
(The decode kernel's copies are picked the same way; tests/test_decode_cpu.py reruns its cases for each.)
"""

import pytest
import torch
from torch.autograd import gradcheck

import attn_ops
from additive_reference import additive_attention_ref, additive_inputs
from cpu_isa_helpers import ISA_LEVELS, force_isa
from reference import (accumulation_dtype, assert_attention_close_to_ref, assert_close_to_ref, dense_inputs,
                       varlen_inputs)
from test_attention_backward import check_backward


@pytest.fixture(params=ISA_LEVELS)
def isa(request, monkeypatch):
    return force_isa(monkeypatch, request.param)


# (B, Tq, Tk, Hq, Hkv, D, kwargs): key lengths across the forward's 256-key tile and the backward's
# 128-key block, GQA groups 1 / 4 / all, causal, window, softcap, single rows.
FORWARD_CASES = {
    "gqa_causal": (2, 67, 300, 8, 2, 64, dict(causal=True)),
    "mha_softcap": (1, 40, 129, 3, 3, 80, dict(softcap=20.0)),
    "mqa_window": (1, 130, 130, 4, 1, 32, dict(window_left=17, window_right=3)),
    "single_row": (2, 1, 1, 4, 2, 16, {}),
    # D = 128: bfloat16 / float16 take brgemm (AMX) in the AVX-512 copy where the CPU has it.
    "d128_causal_odd": (2, 77, 333, 8, 2, 128, dict(causal=True)),
    "d128_softcap_cross": (1, 130, 65, 4, 4, 128, dict(softcap=15.0)),
    "d128_negative_scale": (1, 40, 70, 4, 2, 128, dict(scale=-0.05, causal=True)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64],
                         ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("case", FORWARD_CASES)
def test_forward(isa, case, dtype):
    B, Tq, Tk, Hq, Hkv, D, kw = FORWARD_CASES[case]
    q, k, v = dense_inputs(B, Tq, Tk, Hq, Hkv, D, D, dtype, "cpu")
    assert_attention_close_to_ref(attn_ops.attention(q, k, v, **kw), (q, k, v), **kw)


def test_forward_varlen_and_split_keys(isa):
    """Varlen with an empty sequence (float32, bfloat16), and one long row per KV head (the key-split path
    and its merge)."""
    lens_q, lens_k = [5, 0, 33], [300, 7, 40]
    q, k, v, cu_q, cu_k = varlen_inputs(lens_q, lens_k, 4, 2, 64, 64, torch.float32, "cpu")
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
    assert_attention_close_to_ref(attn_ops.attention(q, k, v, **kw), (q, k, v), **kw)
    q, k, v = dense_inputs(1, 1, 1500, 2, 1, 64, 64, torch.float32, "cpu")
    assert_attention_close_to_ref(attn_ops.attention(q, k, v), (q, k, v))
    q, k, v, cu_q, cu_k = varlen_inputs([70, 0, 1], [300, 5, 129], 8, 2, 128, 128, torch.bfloat16, "cpu")
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
    assert_attention_close_to_ref(attn_ops.attention(q, k, v, **kw), (q, k, v), **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_backward(isa, dtype):
    """test_attention_backward's check (16-bit against float32 gradients rounded once) on each copy."""
    q, k, v = dense_inputs(2, 70, 150, 8, 2, 64, 64, dtype, "cpu")
    # softcap 5: at 30 the cap's derivative changes the gradients by only ~1%
    check_backward(q, k, v, causal=True, softcap=5.0)


def test_gradcheck(isa):
    q, k, v = (t.requires_grad_() for t in dense_inputs(1, 9, 13, 4, 2, 8, 8, torch.float64, "cpu"))
    assert gradcheck(lambda q, k, v: attn_ops.attention(q, k, v, causal=True), (q, k, v))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_additive(isa, dtype):
    """Both score forms: the exp form (small projections) and the tanh form (one entry scaled past it)."""
    inputs64 = list(additive_inputs(2, 9, 37, 40, 16, requires_grad=False))
    inputs64[0][1] *= 100.0  # batch entry 1 takes the tanh form
    inputs64 = [t.requires_grad_() for t in inputs64]
    dout = torch.randn(2, 9, 16, dtype=torch.float64)

    def grads(fn, inputs):
        out, lse = fn(inputs)[:2]
        return [out.detach()] + list(torch.autograd.grad((out * dout.to(out)).sum() + lse.sum(), inputs))

    ref = grads(lambda x: additive_attention_ref(*x), inputs64)
    low = [t.detach().to(dtype).requires_grad_() for t in inputs64]
    ours = grads(lambda x: attn_ops.additive_attention(*x), low)
    # the rule's baseline: computed in float32 from the same rounded inputs, rounded once
    acc = accumulation_dtype(dtype)
    same = grads(lambda x: additive_attention_ref(*x),
                 [t.detach().to(dtype).to(acc).requires_grad_() for t in inputs64])
    for name, o, r, s in zip(["out", "dqp", "dkp", "dw", "dv"], ours, ref, same):
        assert o.dtype == dtype
        assert_close_to_ref(o, r, s.to(dtype), name=name, rounded_intermediates=name != "out")


def test_unknown_isa_is_rejected(monkeypatch):
    monkeypatch.setenv("ATTN_OPS_CPU_ISA", "sse9")
    q, k, v = dense_inputs(1, 3, 3, 2, 1, 8, 8, torch.float32, "cpu")
    with pytest.raises(RuntimeError) as e:
        attn_ops.attention(q, k, v)
    assert "attn_ops: ATTN_OPS_CPU_ISA expected default, avx2 or avx512, got 'sse9'" in str(e.value)
