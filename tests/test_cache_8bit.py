"""8-bit KV caches (float8_e4m3fn, float8_e5m2) with dequantization scales (docs/kvcache_api.md).

- The appends (kv_cache_append, paged_kv_cache_append, mla_cache_append) store exactly the bytes of PyTorch's own
  conversion of clamp(x / scale) (round to nearest even, saturating at the format's largest finite value, NaN kept),
  per-tensor and per-head scales, and leave every other cache byte untouched.
- attention_with_kvcache and mla_decode over an 8-bit cache equal the float64 reference computed on the dequantized
  cache (stored * scale) within the tolerance rule, on every cache layout: contiguous, paged at block sizes 1, 3 and
  16, ragged queries (decode rows and prefill chunks in one call), cache_batch_idx, cache_leftpad.
- Bad input: each error names the argument, and nothing is written.
- opcheck on every op with 8-bit caches, and torch.compile(fullgraph=True) of an in-place append and attention.
"""

import pytest
import torch
from torch.library import opcheck

import attn_ops
from attn_ops import caches
from cpu_isa_helpers import ISA_LEVELS, force_isa
from kvcache_reference import attention_with_kvcache_ref, kvcache_inputs, shuffled_block_table
from mla_reference import mla_decode_ref
from reference import assert_close_to_ref, same_dtype_ref
from serving_reference import attention_with_kvcache_serving_ref, mla_decode_serving_ref

FORMATS = [torch.float8_e4m3fn, torch.float8_e5m2]
MODEL_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SCALES = ["none", "scalar", "one", "per_head"]


def dtype_id(dt):
    return str(dt).replace("torch.", "")


def make_scale(kind, heads, seed):
    """A float32 scale of the given kind (None: not given), values away from 1 so a missed scale shows."""
    g = torch.Generator().manual_seed(seed)
    values = 0.05 + torch.rand(heads, generator=g) * 0.5
    return {"none": None, "scalar": values[0].clone().reshape(()), "one": values[:1].clone(),
            "per_head": values}[kind]


def per_head(scale, heads):
    """The scale as a float64 [heads] tensor (1 when not given)."""
    if scale is None:
        return torch.ones(heads, dtype=torch.float64)
    return scale.double().reshape(-1).expand(heads)


def quantized(x, scale, fmt):
    """PyTorch's conversion of clamp(x / scale) to fmt, per head (x [..., H, D], scale per head)."""
    s = per_head(scale, x.shape[-2]).float().reshape(-1, 1)
    largest = torch.finfo(fmt).max
    return (x.float() / s).clamp(-largest, largest).to(fmt)


def dequantized(cache, scale):
    """The values an 8-bit cache [..., H, D] stands for, in float64: stored * scale (per head)."""
    return cache.double() * per_head(scale, cache.shape[-2]).reshape(-1, 1)


def random_8bit(shape, fmt, seed):
    """A cache of random finite 8-bit values (every byte pattern but the NaNs / infinities)."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    values = bits.view(fmt).float()
    values = torch.where(values.isfinite(), values, torch.zeros_like(values))
    return values.to(fmt)


def with_specials(x):
    """x [B, T, H, D] with values past both formats' range, infinities and NaN in its first row."""
    x = x.clone()
    flat = x.view(-1)
    specials = torch.tensor([1e6, -1e6, 500.0, -500.0, 60000.0, float("inf"), -float("inf"), float("nan"),
                             1e-9, -1e-9, 0.0, -0.0], dtype=x.dtype)
    flat[:specials.numel()] = specials
    return x


def same_bytes(a, b):
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


# --------------------------------------------------------------------------------------------------
# Appends: exact bytes
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale_kind", SCALES)
@pytest.mark.parametrize("src_dtype", MODEL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("fmt", FORMATS, ids=dtype_id)
def test_kv_cache_append_stores_saturated_rounded_bytes(fmt, src_dtype, scale_kind):
    B, cap, H, D, Dv, T = 3, 12, 4, 32, 16, 5
    k_cache = random_8bit((B, cap, H, D), fmt, 1)
    v_cache = random_8bit((B, cap, H, Dv), fmt, 2)
    k = with_specials(torch.randn(B, T, H, D) * 300).to(src_dtype)
    v = (torch.randn(B, T, H, Dv) * 3).to(src_dtype)
    lens = torch.tensor([0, 4, 7], dtype=torch.int32)
    k_scale, v_scale = make_scale(scale_kind, H, 3), make_scale(scale_kind, H, 4)
    k_want, v_want = k_cache.clone(), v_cache.clone()
    for b, L in enumerate(lens.tolist()):
        k_want[b, L:L + T] = quantized(k[b], k_scale, fmt)
        v_want[b, L:L + T] = quantized(v[b], v_scale, fmt)
    attn_ops.kv_cache_append(k_cache, v_cache, k, v, lens, k_scale=k_scale, v_scale=v_scale)
    assert same_bytes(k_cache, k_want)
    assert same_bytes(v_cache, v_want)


@pytest.mark.parametrize("fmt", FORMATS, ids=dtype_id)
def test_kv_cache_append_rows_through_cache_batch_idx(fmt):
    rows, cap, H, D, T = 5, 8, 2, 16, 3
    k_cache, v_cache = random_8bit((rows, cap, H, D), fmt, 5), random_8bit((rows, cap, H, D), fmt, 6)
    k, v = torch.randn(2, T, H, D, dtype=torch.bfloat16) * 4, torch.randn(2, T, H, D, dtype=torch.bfloat16)
    idx, lens = torch.tensor([3, 0], dtype=torch.int32), torch.tensor([2, 5], dtype=torch.int32)
    k_scale = make_scale("per_head", H, 7)
    k_want, v_want = k_cache.clone(), v_cache.clone()
    for b, (r, L) in enumerate(zip(idx.tolist(), lens.tolist())):
        k_want[r, L:L + T] = quantized(k[b], k_scale, fmt)
        v_want[r, L:L + T] = quantized(v[b], None, fmt)
    attn_ops.kv_cache_append(k_cache, v_cache, k, v, lens, cache_batch_idx=idx, k_scale=k_scale)
    assert same_bytes(k_cache, k_want) and same_bytes(v_cache, v_want)


@pytest.mark.parametrize("scale_kind", ["scalar", "per_head"])
@pytest.mark.parametrize("fmt", FORMATS, ids=dtype_id)
def test_paged_kv_cache_append_stores_saturated_rounded_bytes(fmt, scale_kind):
    blocks, bs, H, D = 6, 3, 2, 24
    k_cache, v_cache = random_8bit((blocks, bs, H, D), fmt, 8), random_8bit((blocks, bs, H, D), fmt, 9)
    k = with_specials(torch.randn(1, 7, H, D) * 200)[0]
    v = torch.randn(7, H, D)
    slots = torch.tensor([4, 0, -1, 17, 9, 10, 2], dtype=torch.int64)
    k_scale, v_scale = make_scale(scale_kind, H, 10), make_scale(scale_kind, H, 11)
    k_want, v_want = k_cache.clone(), v_cache.clone()
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            k_want[s // bs, s % bs] = quantized(k[i], k_scale, fmt)
            v_want[s // bs, s % bs] = quantized(v[i], v_scale, fmt)
    attn_ops.paged_kv_cache_append(k_cache, v_cache, k, v, slots, k_scale=k_scale, v_scale=v_scale)
    assert same_bytes(k_cache, k_want) and same_bytes(v_cache, v_want)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("fmt", FORMATS, ids=dtype_id)
def test_mla_cache_append_scales_every_column(fmt, paged):
    d_c, d_r, kv_scale = 64, 16, torch.tensor([0.125])
    if paged:
        cache = random_8bit((4, 5, d_c + d_r), fmt, 12)
        c_kv, k_pe = with_specials(torch.randn(1, 1, 6, d_c) * 100)[0, 0], torch.randn(6, d_r) * 50
        slots = torch.tensor([3, -1, 19, 0, 7, 12], dtype=torch.int32)
        want = cache.clone()
        for i, s in enumerate(slots.tolist()):
            if s >= 0:
                row = torch.cat([c_kv[i], k_pe[i]]).reshape(1, -1)
                want[s // 5, s % 5] = quantized(row, kv_scale, fmt)[0]
        attn_ops.mla_cache_append(cache, c_kv, k_pe, slot_mapping=slots, kv_scale=kv_scale)
    else:
        cache = random_8bit((2, 9, d_c + d_r), fmt, 13)
        c_kv, k_pe = torch.randn(2, 3, d_c, dtype=torch.bfloat16) * 100, torch.randn(2, 3, d_r, dtype=torch.bfloat16)
        lens = torch.tensor([5, 0], dtype=torch.int32)
        want = cache.clone()
        for b, L in enumerate(lens.tolist()):
            rows = torch.cat([c_kv[b], k_pe[b]], -1).unsqueeze(-2)  # [T, 1, d_c + d_r]
            want[b, L:L + 3] = quantized(rows, kv_scale, fmt)[:, 0]
        attn_ops.mla_cache_append(cache, c_kv, k_pe, cache_seqlens=lens, kv_scale=kv_scale)
    assert same_bytes(cache, want)


# --------------------------------------------------------------------------------------------------
# Attention over 8-bit caches
# --------------------------------------------------------------------------------------------------
def head_major(cache):
    """The same values as the [rows, slots, Hkv, D] view of a [rows, Hkv, slots, D] tensor: each KV head's rows
    contiguous, as KVCache / PagedKVCache store them on the CPU (the decode kernel then reads one head per item and
    converts 8-bit rows in registers)."""
    return cache.transpose(1, 2).contiguous().transpose(1, 2)


def quantized_cache_inputs(fmt, dtype, B, Tq, Hq, Hkv, D, Dv, lens, block_size, scale_kind, seed, layout="bshd"):
    """q in the model dtype, 8-bit caches (random, quantized from model-dtype values, past each row's length too;
    layout "bshd" or "head_major") and their scales."""
    torch.manual_seed(seed)
    q, k_cache, v_cache, seqlens, bt = kvcache_inputs(B, Tq, Hq, Hkv, D, Dv, lens, dtype=dtype,
                                                      block_size=block_size)
    k_scale, v_scale = make_scale(scale_kind, Hkv, seed + 1), make_scale(scale_kind, Hkv, seed + 2)
    k8 = quantized(k_cache * 3, k_scale, fmt)
    v8 = quantized(v_cache * 3, v_scale, fmt)
    if layout == "head_major":
        k8, v8 = head_major(k8), head_major(v8)
    return q, k8, v8, seqlens, bt, k_scale, v_scale


def check_against_dequantized(q, k8, v8, seqlens, k_scale, v_scale, ref_fn=attention_with_kvcache_ref,
                              num_splits=0, **kw):
    out, lse = attn_ops.attention_with_kvcache(q, k8, v8, seqlens, k_scale=k_scale, v_scale=v_scale,
                                               num_splits=num_splits, **kw)
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    k64, v64 = dequantized(k8, k_scale), dequantized(v8, v_scale)
    r_out, r_lse = ref_fn(q, k64, v64, seqlens, **kw)
    s_out, s_lse = same_dtype_ref(ref_fn, q, k64.to(q.dtype), v64.to(q.dtype), seqlens, **kw,
                                  compute_dtype=q.dtype)
    assert_close_to_ref(out, r_out, s_out, name="out")
    assert_close_to_ref(lse, r_lse, s_lse, name="lse")


# name: (Tq, Hq, Hkv, D, Dv, lens, block_size)
CASES = {
    "decode_gqa_contiguous": (1, 8, 2, 64, 64, [37, 1, 100], None),
    "decode_mqa_paged3": (1, 8, 1, 32, 32, [5, 30, 4], 3),
    "decode_paged1": (1, 4, 4, 32, 16, [9, 1], 1),
    "decode_d72_dv40_contiguous": (2, 8, 2, 72, 40, [70, 33], None),  # partial 32-value chunks
    "decode_long_paged16": (1, 4, 1, 128, 128, [1500, 700], 16),  # key splits
    "spec_tq4_paged16": (4, 8, 2, 64, 64, [40, 70], 16),
    "prefill_tq40_contiguous": (40, 4, 2, 32, 32, [60, 40], None),
    "prefill_tq24_paged16": (24, 8, 2, 64, 32, [90, 24], 16),
}


@pytest.mark.parametrize("layout", ["bshd", "head_major"])
@pytest.mark.parametrize("scale_kind", ["none", "scalar", "per_head"])
@pytest.mark.parametrize("dtype", MODEL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("fmt", FORMATS, ids=dtype_id)
@pytest.mark.parametrize("case", list(CASES))
def test_attention_over_8bit_cache_matches_dequantized_reference(case, fmt, dtype, scale_kind, layout):
    Tq, Hq, Hkv, D, Dv, lens, bs = CASES[case]
    q, k8, v8, seqlens, bt, k_scale, v_scale = quantized_cache_inputs(fmt, dtype, len(lens), Tq, Hq, Hkv, D, Dv,
                                                                      lens, bs, scale_kind, 20, layout)
    check_against_dequantized(q, k8, v8, seqlens, k_scale, v_scale, block_table=bt)


@pytest.mark.parametrize("isa", ISA_LEVELS)
@pytest.mark.parametrize("dtype", MODEL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("fmt", FORMATS, ids=dtype_id)
def test_each_isa_copy_reads_8bit_caches(fmt, dtype, isa, monkeypatch):
    """The conversion runs in each instruction set's copy of the decode and prefill kernels."""
    force_isa(monkeypatch, isa)
    for case, layout in [("decode_gqa_contiguous", "bshd"), ("decode_gqa_contiguous", "head_major"),
                         ("decode_d72_dv40_contiguous", "head_major"), ("decode_paged1", "bshd"),
                         ("prefill_tq24_paged16", "head_major")]:
        Tq, Hq, Hkv, D, Dv, lens, bs = CASES[case]
        q, k8, v8, seqlens, bt, k_scale, v_scale = quantized_cache_inputs(fmt, dtype, len(lens), Tq, Hq, Hkv, D, Dv,
                                                                          lens, bs, "per_head", 25, layout)
        check_against_dequantized(q, k8, v8, seqlens, k_scale, v_scale, block_table=bt)


@pytest.mark.parametrize("products", ["pairs", "widened"])
@pytest.mark.parametrize("fmt", FORMATS, ids=dtype_id)
def test_bf16_decode_reads_8bit_rows_in_registers(fmt, products, monkeypatch):
    """bfloat16 decode over head-major 8-bit caches converts in registers: 64 codes a load with the bfloat16-pair
    products (head dims in whole 64s), 32 otherwise, and with the widened float32 products (ATTN_OPS_CPU_AVX512BF16=0;
    on a CPU without AVX512-BF16 or VBMI both take the other paths)."""
    monkeypatch.setenv("ATTN_OPS_CPU_AVX512BF16", "1" if products == "pairs" else "0")
    for case in ("decode_gqa_contiguous", "decode_d72_dv40_contiguous", "decode_long_paged16", "spec_tq4_paged16"):
        Tq, Hq, Hkv, D, Dv, lens, bs = CASES[case]
        q, k8, v8, seqlens, bt, k_scale, v_scale = quantized_cache_inputs(fmt, torch.bfloat16, len(lens), Tq, Hq, Hkv,
                                                                          D, Dv, lens, bs, "per_head", 35,
                                                                          "head_major")
        check_against_dequantized(q, k8, v8, seqlens, k_scale, v_scale, block_table=bt)
        check_against_dequantized(q, k8, v8, seqlens, k_scale, v_scale, block_table=bt, num_splits=1)


@pytest.mark.parametrize("fmt", FORMATS, ids=dtype_id)
def test_attention_over_8bit_cache_with_score_options(fmt):
    q, k8, v8, seqlens, bt, k_scale, v_scale = quantized_cache_inputs(fmt, torch.bfloat16, 2, 3, 8, 2, 64, 64,
                                                                      [50, 33], 16, "per_head", 30)
    check_against_dequantized(q, k8, v8, seqlens, k_scale, v_scale, block_table=bt, softcap=5.0, window_left=9,
                              alibi_slopes=attn_ops.alibi_slopes(8))


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("fmt", FORMATS, ids=dtype_id)
def test_ragged_serving_batch_over_8bit_cache(fmt, dtype, paged):
    """Decode rows and prefill chunks (past the decode kernel's 32 rows per KV head) in one packed call, rows of a
    larger pool through cache_batch_idx, left padding."""
    torch.manual_seed(40)
    Hq, Hkv, D, rows, cap = 8, 2, 64, 5, 96
    q_lens, lens, pad = [1, 20, 1, 3], [40, 60, 7, 90], [0, 5, 3, 0]
    k_scale, v_scale = make_scale("per_head", Hkv, 41), make_scale("scalar", Hkv, 42)
    k8 = quantized(torch.randn(rows, cap, Hkv, D) * 2, k_scale, fmt)
    v8 = quantized(torch.randn(rows, cap, Hkv, D) * 2, v_scale, fmt)
    kw = dict(cache_batch_idx=torch.tensor([4, 0, 2, 1], dtype=torch.int32),
              cache_leftpad=torch.tensor(pad, dtype=torch.int32))
    if paged:
        bs = 16
        bt = shuffled_block_table(rows, cap // bs, rows * cap // bs)
        k8 = k8.reshape(rows * cap // bs, bs, Hkv, D).clone()
        v8 = v8.reshape(rows * cap // bs, bs, Hkv, D).clone()
        kw["block_table"] = bt
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(int(cu[-1]), Hq, D, dtype=dtype)
    check_against_dequantized(q, k8, v8, torch.tensor(lens, dtype=torch.int32), k_scale, v_scale,
                              ref_fn=attention_with_kvcache_serving_ref, cu_seqlens_q=cu, **kw)


def mla_inputs(fmt, dtype, B, Tq, H, lens, block_size, seed, d_c=128, d_r=32):
    torch.manual_seed(seed)
    cap = max(lens) + 4
    if block_size is not None:
        cap = -(-cap // block_size) * block_size
    kv_scale = torch.tensor(0.07)
    cache = quantized((torch.randn(B, cap, 1, d_c + d_r) * 2), kv_scale, fmt)[:, :, 0]
    bt = None
    if block_size is not None:
        nblk = cap // block_size
        bt = shuffled_block_table(B, nblk, B * nblk)
        pool = torch.empty(B * nblk, block_size, d_c + d_r, dtype=fmt)
        for b in range(B):
            for j in range(nblk):
                pool[bt[b, j]] = cache[b, j * block_size:(j + 1) * block_size]
        cache = pool
    q_latent = torch.randn(B, Tq, H, d_c, dtype=dtype)
    q_rope = torch.randn(B, Tq, H, d_r, dtype=dtype)
    return q_latent, q_rope, cache, torch.tensor(lens, dtype=torch.int32), bt, kv_scale


@pytest.mark.parametrize("Tq,H", [(1, 16), (2, 4), (40, 2)])
@pytest.mark.parametrize("block_size", [None, 1, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("fmt", FORMATS, ids=dtype_id)
def test_mla_decode_over_8bit_latent_cache(fmt, dtype, block_size, Tq, H):
    q_latent, q_rope, cache, lens, bt, kv_scale = mla_inputs(fmt, dtype, 2, Tq, H, [70, Tq + 3], block_size, 50)
    scale = 0.1
    out, lse = attn_ops.mla_decode(q_latent, q_rope, cache, lens, scale=scale, block_table=bt, kv_scale=kv_scale)
    cache64 = cache.double() * float(kv_scale)
    r_out, r_lse = mla_decode_ref(q_latent, q_rope, cache64, lens, scale=scale, block_table=bt)
    s_out, s_lse = same_dtype_ref(mla_decode_ref, q_latent, q_rope, cache64.to(dtype), lens, scale=scale,
                                  block_table=bt, compute_dtype=dtype)
    assert_close_to_ref(out, r_out, s_out, name="out_latent")
    assert_close_to_ref(lse, r_lse, s_lse, name="lse")


def test_mla_decode_over_8bit_cache_with_serving_rows():
    q_latent, q_rope, cache, lens, _, kv_scale = mla_inputs(torch.float8_e4m3fn, torch.bfloat16, 3, 2, 8,
                                                            [30, 12, 50], None, 60)
    q_latent, q_rope = q_latent[:2].reshape(4, 8, -1)[:3], q_rope[:2].reshape(4, 8, -1)[:3]
    kw = dict(cu_seqlens_q=torch.tensor([0, 1, 3], dtype=torch.int32),
              cache_batch_idx=torch.tensor([2, 0], dtype=torch.int32),
              cache_leftpad=torch.tensor([4, 0], dtype=torch.int32))
    lens = torch.tensor([50, 30], dtype=torch.int32)
    out, lse = attn_ops.mla_decode(q_latent, q_rope, cache, lens, scale=0.2, kv_scale=kv_scale, **kw)
    cache64 = cache.double() * float(kv_scale)
    r = mla_decode_serving_ref(q_latent, q_rope, cache64, lens, scale=0.2, **kw)
    s = same_dtype_ref(mla_decode_serving_ref, q_latent, q_rope, cache64.to(torch.bfloat16), lens, scale=0.2,
                       compute_dtype=torch.bfloat16, **kw)
    assert_close_to_ref(out, r[0], s[0], name="out_latent")
    assert_close_to_ref(lse, r[1], s[1], name="lse")


def test_append_then_attend_round_trip():
    """Quantize with kv_cache_append, read with attention_with_kvcache: the result is attention over the
    dequantized values the append stored."""
    torch.manual_seed(70)
    B, Hq, Hkv, D, T = 2, 8, 2, 64, 9
    k_cache = torch.zeros(B, 16, Hkv, D, dtype=torch.float8_e4m3fn)
    v_cache = torch.zeros(B, 16, Hkv, D, dtype=torch.float8_e4m3fn)
    k, v = torch.randn(B, T, Hkv, D, dtype=torch.bfloat16) * 5, torch.randn(B, T, Hkv, D, dtype=torch.bfloat16)
    k_scale, v_scale = make_scale("per_head", Hkv, 71), make_scale("scalar", Hkv, 72)
    lens = torch.zeros(B, dtype=torch.int32)
    attn_ops.kv_cache_append(k_cache, v_cache, k, v, lens, k_scale=k_scale, v_scale=v_scale)
    q = torch.randn(B, 1, Hq, D, dtype=torch.bfloat16)
    check_against_dequantized(q, k_cache, v_cache, lens + T, k_scale, v_scale)


# --------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------
def append_args(fmt=torch.float8_e4m3fn):
    k_cache = random_8bit((2, 8, 2, 16), fmt, 80)
    v_cache = random_8bit((2, 8, 2, 16), fmt, 81)
    k, v = torch.randn(2, 1, 2, 16), torch.randn(2, 1, 2, 16)
    return k_cache, v_cache, k, v, torch.tensor([1, 2], dtype=torch.int32)


SCALE_ERRORS = [
    (torch.tensor([0.5, 0.5, 0.5]), r"k_scale must have shape \[\], \[1\] or \[2\].*got \[3\]"),
    (torch.tensor([[0.5]]), r"k_scale must have shape \[\], \[1\] or \[2\].*got \[1, 1\]"),
    (torch.tensor(0.5, dtype=torch.float16), r"k_scale must be float32, got float16"),
    (torch.tensor([0.5, 0.0]), r"k_scale must be positive and finite, got 0 at index 1"),
    (torch.tensor(-1.0), r"k_scale must be positive and finite, got -1"),
    (torch.tensor([float("nan")]), r"k_scale must be positive and finite, got nan"),
    (torch.tensor([float("inf"), 1.0]), r"k_scale must be positive and finite, got inf at index 0"),
    (torch.tensor(0.5, device="meta"), r"k_scale must be on the same device as k_cache \(cpu\), got meta"),
]


@pytest.mark.parametrize("bad,match", SCALE_ERRORS, ids=range(len(SCALE_ERRORS)))
def test_bad_scale_rejected_before_any_write(bad, match):
    k_cache, v_cache, k, v, lens = append_args()
    before = k_cache.clone(), v_cache.clone()
    with pytest.raises(RuntimeError, match=r"attn_ops\.kv_cache_append: " + match):
        attn_ops.kv_cache_append(k_cache, v_cache, k, v, lens, k_scale=bad)
    assert same_bytes(k_cache, before[0]) and same_bytes(v_cache, before[1])
    q = torch.randn(2, 1, 4, 16)
    with pytest.raises(RuntimeError, match=r"attn_ops\.attention_with_kvcache: " + match):
        attn_ops.attention_with_kvcache(q, k_cache, v_cache, lens, k_scale=bad)


def test_bad_kv_scale_of_mla():
    cache = random_8bit((2, 8, 48), torch.float8_e5m2, 82)
    c_kv, k_pe = torch.randn(2, 1, 32), torch.randn(2, 1, 16)
    lens = torch.tensor([1, 2], dtype=torch.int32)
    before = cache.clone()
    with pytest.raises(RuntimeError, match=r"attn_ops\.mla_cache_append: kv_scale must have shape \[\], \[1\] or "
                                           r"\[1\].*got \[2\]"):
        attn_ops.mla_cache_append(cache, c_kv, k_pe, cache_seqlens=lens, kv_scale=torch.tensor([1.0, 2.0]))
    assert same_bytes(cache, before)
    with pytest.raises(RuntimeError, match=r"attn_ops\.mla_decode: kv_scale must be positive and finite"):
        attn_ops.mla_decode(torch.randn(2, 1, 4, 32), torch.randn(2, 1, 4, 16), cache, lens, scale=0.1,
                            kv_scale=torch.tensor(-2.0))


def test_scale_with_16bit_cache_refused():
    k_cache, v_cache = torch.randn(2, 8, 2, 16), torch.randn(2, 8, 2, 16)
    with pytest.raises(RuntimeError, match=r"kv_cache_append: v_scale applies to 8-bit caches \(float8_e4m3fn, "
                                           r"float8_e5m2\) only, but v_cache is float32"):
        attn_ops.kv_cache_append(k_cache, v_cache, torch.randn(2, 1, 2, 16), torch.randn(2, 1, 2, 16),
                                 torch.tensor([0, 0], dtype=torch.int32), v_scale=torch.tensor(1.0))


def test_8bit_q_refused():
    k_cache, v_cache, _, _, lens = append_args()
    q = torch.randn(2, 1, 4, 16).to(torch.float8_e4m3fn)
    with pytest.raises(RuntimeError, match=r"attention_with_kvcache: q must be float16, bfloat16, float32 or "
                                           r"float64, got float8_e4m3fn"):
        attn_ops.attention_with_kvcache(q, k_cache, v_cache, lens)


def test_float64_model_with_8bit_cache_refused():
    k_cache, v_cache, k, v, lens = append_args()
    before = k_cache.clone()
    with pytest.raises(RuntimeError, match=r"kv_cache_append: k must be float16, bfloat16 or float32 with an "
                                           r"8-bit k_cache \(float8_e4m3fn\), got float64"):
        attn_ops.kv_cache_append(k_cache, v_cache, k.double(), v.double(), lens)
    assert same_bytes(k_cache, before)
    with pytest.raises(RuntimeError, match=r"attention_with_kvcache: q must be float16, bfloat16 or float32 with "
                                           r"an 8-bit k_cache"):
        attn_ops.attention_with_kvcache(torch.randn(2, 1, 4, 16, dtype=torch.float64), k_cache, v_cache, lens)


def test_mixed_cache_dtypes_refused():
    k_cache, _, k, v, lens = append_args(torch.float8_e4m3fn)
    _, v_cache, _, _, _ = append_args(torch.float8_e5m2)
    before = k_cache.clone()
    with pytest.raises(RuntimeError, match=r"kv_cache_append: v_cache must have the same dtype as k_cache "
                                           r"\(float8_e4m3fn\), got float8_e5m2"):
        attn_ops.kv_cache_append(k_cache, v_cache, k, v, lens)
    assert same_bytes(k_cache, before)
    with pytest.raises(RuntimeError, match=r"attention_with_kvcache: v_cache must have the same dtype as k_cache"):
        attn_ops.attention_with_kvcache(torch.randn(2, 1, 4, 16), k_cache, v_cache, lens)
    with pytest.raises(RuntimeError, match=r"attention_with_kvcache: v_cache must have the same dtype as k_cache "
                                           r"\(float8_e4m3fn\), got float32"):
        attn_ops.attention_with_kvcache(torch.randn(2, 1, 4, 16), k_cache, torch.randn(2, 8, 2, 16), lens)


def test_mixed_new_token_dtypes_refused():
    k_cache, v_cache, k, v, lens = append_args()
    with pytest.raises(RuntimeError, match=r"kv_cache_append: v must have the same dtype as k \(float32\), "
                                           r"got bfloat16"):
        attn_ops.kv_cache_append(k_cache, v_cache, k, v.bfloat16(), lens)


def test_16bit_cache_of_other_dtype_refused():
    with pytest.raises(RuntimeError, match=r"kv_cache_append: k must have the same dtype as k_cache \(bfloat16\), "
                                           r"got float32"):
        attn_ops.kv_cache_append(torch.randn(2, 8, 2, 16, dtype=torch.bfloat16),
                                 torch.randn(2, 8, 2, 16, dtype=torch.bfloat16), torch.randn(2, 1, 2, 16),
                                 torch.randn(2, 1, 2, 16), torch.tensor([0, 0], dtype=torch.int32))


# --------------------------------------------------------------------------------------------------
# opcheck and torch.compile
# --------------------------------------------------------------------------------------------------
# opcheck's test_schema detects mutations with torch.allclose, which PyTorch does not implement for float8 on the
# CPU ("mul_cpu_reduced_float" not implemented for 'Float8_e4m3fn'); the other utilities run. The schemas' mutation
# declarations are those of the 16-bit ops, which test_kvcache_compile.py / test_mla_compile.py opcheck in full,
# and test_untouched_arguments_of_8bit_ops below checks by bytes what test_schema would.
OPCHECK_UTILS = ("test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic",
                 "test_autograd_registration")


def opcheck_8bit_cases(fmt):
    """(op, args, kwargs, mutated argument positions) of every op over 8-bit caches."""
    k_cache, v_cache, k, v, lens = append_args(fmt)
    scale = torch.tensor([0.5, 0.25])
    latent = random_8bit((2, 8, 48), fmt, 83)
    q = torch.randn(2, 1, 4, 16, dtype=torch.bfloat16)
    return [
        (torch.ops.attn_ops.kv_cache_append.default, (k_cache, v_cache, k, v, lens),
         dict(k_scale=scale, v_scale=scale[:1]), (0, 1)),
        (torch.ops.attn_ops.paged_kv_cache_append.default,
         (k_cache.clone(), v_cache.clone(), k[:, 0], v[:, 0], torch.tensor([3, 9], dtype=torch.int32)),
         dict(k_scale=scale), (0, 1)),
        (torch.ops.attn_ops.attention_with_kvcache.default, (q, k_cache.clone(), v_cache.clone(), lens),
         dict(k_scale=scale, v_scale=torch.tensor(2.0)), ()),
        (torch.ops.attn_ops.mla_cache_append.default, (latent, torch.randn(2, 1, 32), torch.randn(2, 1, 16)),
         dict(cache_seqlens=lens, kv_scale=torch.tensor([0.3])), (0,)),
        (torch.ops.attn_ops.mla_decode.default,
         (torch.randn(2, 1, 4, 32), torch.randn(2, 1, 4, 16), latent.clone(), lens),
         dict(scale=0.1, kv_scale=torch.tensor(0.3)), ()),
    ]


@pytest.mark.parametrize("fmt", FORMATS, ids=dtype_id)
def test_opcheck_ops_over_8bit_caches(fmt):
    for op, args, kwargs, _ in opcheck_8bit_cases(fmt):
        opcheck(op, args, kwargs, test_utils=OPCHECK_UTILS)


@pytest.mark.parametrize("fmt", FORMATS, ids=dtype_id)
def test_untouched_arguments_of_8bit_ops(fmt):
    """Each op changes only the arguments its schema marks mutable (compared by bytes), and those it does change."""
    for op, args, kwargs, mutated in opcheck_8bit_cases(fmt):
        tensors = [(i, a) for i, a in enumerate(list(args) + list(kwargs.values())) if isinstance(a, torch.Tensor)]
        before = [a.clone() for _, a in tensors]
        op(*args, **kwargs)
        for (i, a), b in zip(tensors, before):
            assert same_bytes(a, b) != (i in mutated), f"{op}: argument {i}"


def test_compile_fullgraph_append_and_attend_over_8bit_cache():
    torch.manual_seed(90)
    B, Hq, Hkv, D = 2, 8, 2, 32
    k_scale, v_scale = torch.tensor([0.5, 0.25]), torch.tensor(0.125)

    def step(q, k, v, k_cache, v_cache, lens, k_scale, v_scale):
        attn_ops.kv_cache_append(k_cache, v_cache, k, v, lens, k_scale=k_scale, v_scale=v_scale)
        return attn_ops.attention_with_kvcache(q, k_cache, v_cache, lens + 1, k_scale=k_scale, v_scale=v_scale)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    caches = [torch.zeros(B, 16, Hkv, D, dtype=torch.float8_e5m2) for _ in range(4)]
    lens = torch.tensor([3, 7], dtype=torch.int32)
    for _ in range(2):  # new scale values reach the compiled step (tensors, not constants)
        q, k, v = torch.randn(B, 1, Hq, D), torch.randn(B, 1, Hkv, D), torch.randn(B, 1, Hkv, D)
        want = step(q, k, v, caches[0], caches[1], lens, k_scale, v_scale)
        got = compiled(q, k, v, caches[2], caches[3], lens, k_scale, v_scale)
        assert same_bytes(caches[0], caches[2]) and same_bytes(caches[1], caches[3])
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
        k_scale, v_scale = k_scale * 2, v_scale * 3
        lens = lens + 1


# --------------------------------------------------------------------------------------------------
# The caches of attn_ops.caches
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("paged", [False, True], ids=["KVCache", "PagedKVCache"])
@pytest.mark.parametrize("fmt", FORMATS, ids=dtype_id)
def test_kv_caches_store_and_read_8bit(fmt, paged):
    """append quantizes with the cache's scales, attend reads stored * scale: attention over the dequantized
    storage, which holds the quantized values of what was appended."""
    torch.manual_seed(100)
    B, T, Hq, Hkv, D = 2, 5, 8, 2, 32
    k_scale, v_scale = torch.tensor([0.02, 0.05]), 0.03
    if paged:
        cache = caches.PagedKVCache(1, 8, 4, Hkv, D, B, 4, dtype=fmt, k_scale=k_scale, v_scale=v_scale)
        cache.reserve(T)
    else:
        cache = caches.KVCache(1, B, 16, Hkv, D, dtype=fmt, k_scale=k_scale, v_scale=v_scale)
    assert cache.dtype == fmt and cache.bytes_per_token == 2 * Hkv * D
    assert torch.equal(cache.k_scale, k_scale) and torch.equal(cache.v_scale, torch.tensor([0.03]))
    k, v = torch.randn(B, T, Hkv, D, dtype=torch.bfloat16), torch.randn(B, T, Hkv, D, dtype=torch.bfloat16)
    q = torch.randn(B, T, Hq, D, dtype=torch.bfloat16)
    cache.append(0, k, v)
    out = cache.attend(0, q)
    block_table = cache.block_table[:B] if paged else None
    lens = torch.full((B,), T, dtype=torch.int32)
    stored_k = torch.stack([gather(cache.k[0], b, T, block_table) for b in range(B)])
    assert same_bytes(stored_k, quantized(k, k_scale, fmt))
    k64, v64 = dequantized(cache.k[0], k_scale), dequantized(cache.v[0], torch.tensor([0.03]))
    r_out, _ = attention_with_kvcache_ref(q, k64, v64, lens, block_table=block_table)
    s_out, _ = same_dtype_ref(attention_with_kvcache_ref, q, k64.bfloat16(), v64.bfloat16(), lens,
                              block_table=block_table, compute_dtype=torch.bfloat16)
    assert_close_to_ref(out, r_out, s_out, name="out")


def gather(cache, b, n, block_table):
    """Row b's first n entries of a contiguous or paged cache."""
    if block_table is None:
        return cache[b, :n]
    bs = cache.shape[1]
    return torch.cat([cache[int(block_table[b, j // bs]), j % bs].unsqueeze(0) for j in range(n)])


@pytest.mark.parametrize("paged", [False, True], ids=["LatentKVCache", "PagedLatentKVCache"])
def test_latent_caches_store_and_read_8bit(paged):
    torch.manual_seed(101)
    B, T, H, d_c, d_r, fmt = 2, 3, 4, 64, 16, torch.float8_e4m3fn
    if paged:
        cache = caches.PagedLatentKVCache(1, 8, 4, d_c, d_r, B, 4, dtype=fmt, kv_scale=0.05)
        cache.reserve(T)
    else:
        cache = caches.LatentKVCache(1, B, 8, d_c, d_r, dtype=fmt, kv_scale=torch.tensor(0.05))
    assert cache.bytes_per_token == d_c + d_r
    c_kv, k_pe = torch.randn(B, T, d_c), torch.randn(B, T, d_r)
    cache.append(0, c_kv, k_pe)
    q_latent, q_rope = torch.randn(B, T, H, d_c), torch.randn(B, T, H, d_r)
    out = cache.attend(0, q_latent, q_rope, scale=0.1)
    block_table = cache.block_table[:B] if paged else None
    stored = torch.stack([gather(cache.latent[0], b, T, block_table) for b in range(B)])
    rows = torch.cat([c_kv, k_pe], -1).unsqueeze(-2)  # [B, T, 1, d_c + d_r]: one head
    assert same_bytes(stored, quantized(rows, torch.tensor([0.05]), fmt)[..., 0, :])
    lens = torch.full((B,), T, dtype=torch.int32)
    cache64 = cache.latent[0].double() * 0.05
    r_out, _ = mla_decode_ref(q_latent, q_rope, cache64, lens, scale=0.1, block_table=block_table)
    s_out, _ = same_dtype_ref(mla_decode_ref, q_latent, q_rope, cache64.float(), lens, scale=0.1,
                              block_table=block_table, compute_dtype=torch.float32)
    assert_close_to_ref(out, r_out, s_out, name="out_latent")


def test_cache_scale_arguments_checked():
    with pytest.raises(ValueError, match=r"k_scale applies to 8-bit caches \(torch.float8_e4m3fn, "
                                         r"torch.float8_e5m2\) only, got dtype=torch.bfloat16"):
        caches.KVCache(1, 2, 8, 2, 16, dtype=torch.bfloat16, k_scale=0.5)
    with pytest.raises(ValueError, match=r"v_scale must hold one value or one per KV head \(2\), got 3 values"):
        caches.KVCache(1, 2, 8, 2, 16, dtype=torch.float8_e4m3fn, v_scale=[1.0, 2.0, 3.0])
    cache = caches.KVCache(1, 2, 8, 2, 16, dtype=torch.float8_e5m2)
    assert torch.equal(cache.k_scale, torch.ones(1)) and torch.equal(cache.v_scale, torch.ones(1))
    assert caches.KVCache(1, 2, 8, 2, 16).k_scale is None
