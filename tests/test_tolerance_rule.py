"""The tolerance rule itself (reference.assert_close_to_ref with the same_dtype_ref baseline): on realistic shapes
it passes the op and fails a deliberately wrong one, in every dtype. A 1% error in a bfloat16 kernel passed the
rule's earlier form (a baseline run in bfloat16 throughout and a floor of 8e-3 absolute)."""

import pytest
import torch

import attn_ops
from kvcache_reference import attention_with_kvcache_ref, kvcache_inputs
from reference import assert_attention_close_to_ref, assert_close_to_ref, attention_ref, dense_inputs, same_dtype_ref

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def dtype_id(dt):
    return str(dt).replace("torch.", "")


def output_off(fn, factor):
    """fn with its output (not lse) multiplied by factor: a kernel that errs by (factor - 1) relative."""
    def wrong(*args, **kw):
        out, lse = fn(*args, **kw)
        return (out.float() * factor).to(out.dtype), lse
    return wrong


def scale_off(fn, factor):
    """fn with its softmax scale multiplied by factor."""
    def wrong(q, *args, **kw):
        return fn(q, *args, scale=factor * q.shape[-1] ** -0.5, **kw)
    return wrong


PREFILL = [dict(B=2, T=256, Hq=8, Hkv=2, D=64, causal=True), dict(B=1, T=300, Hq=4, Hkv=4, D=128, causal=False)]


@pytest.mark.parametrize("case", PREFILL, ids=["gqa_causal_d64", "mha_d128"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_rule_passes_the_op_and_fails_a_one_percent_error(dtype, case):
    q, k, v = dense_inputs(case["B"], case["T"], case["T"], case["Hq"], case["Hkv"], case["D"], case["D"], dtype,
                           "cpu")
    kw = dict(causal=case["causal"])
    assert_attention_close_to_ref(attn_ops.attention(q, k, v, **kw), (q, k, v), **kw)
    for wrong in (output_off(attn_ops.attention, 1.01), scale_off(attn_ops.attention, 1.01)):
        with pytest.raises(AssertionError, match="max\\|ours - ref64\\|"):
            assert_attention_close_to_ref(wrong(q, k, v, **kw), (q, k, v), **kw)


def check_decode(fn, q, kc, vc, lens):
    out, lse = fn(q, kc, vc, lens)
    r64 = attention_with_kvcache_ref(q, kc, vc, lens)
    base = same_dtype_ref(attention_with_kvcache_ref, q, kc, vc, lens, compute_dtype=q.dtype)
    assert_close_to_ref(out, r64[0], base[0], name="out")
    assert_close_to_ref(lse, r64[1], base[1], name="lse")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_rule_fails_a_one_percent_error_in_decode(dtype):
    """The audit's decode case (B=3, Tq=1, Tk=257), which a 2% scale error passed."""
    q, kc, vc, lens, _ = kvcache_inputs(3, 1, 8, 2, 64, 64, [257, 257, 257], dtype=dtype)
    check_decode(attn_ops.attention_with_kvcache, q, kc, vc, lens)
    for wrong in (output_off(attn_ops.attention_with_kvcache, 1.01),
                  scale_off(attn_ops.attention_with_kvcache, 1.01)):
        with pytest.raises(AssertionError, match="max\\|ours - ref64\\|"):
            check_decode(wrong, q, kc, vc, lens)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
def test_baseline_rounds_once_from_a_float32_computation(dtype):
    """The 16-bit baseline is the float32 computation rounded once: within half an ulp of it, elementwise."""
    q, k, v = dense_inputs(1, 64, 64, 2, 1, 32, 32, dtype, "cpu")
    base, _ = same_dtype_ref(attention_ref, q, k, v, compute_dtype=dtype)
    r32, _ = attention_ref(q, k, v, compute_dtype=torch.float32, p_dtype=dtype)
    assert base.dtype == dtype
    half_ulp = torch.finfo(dtype).eps / 2 * r32.abs()
    assert ((base.float() - r32).abs() <= half_ulp + torch.finfo(dtype).tiny).all()
