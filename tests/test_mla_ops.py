"""mla_cache_append and mla_decode (docs/mla_api.md) against the references of tests/mla_reference.py.

Appends: a copy is exact, so every check compares bits over the whole buffer the latent cache lives
in (a write to the wrong row / slot, to the padding of a strided view, or a swap of c_kv and k_pe is
caught). Decode: the tolerance rule max|ours - ref64| <= 2 * max|same_dtype - ref64| + eps on
out_latent and lse (lse -inf exactly where the reference is -inf); cache entries past each row's
length are random, so a kernel that reads them is caught. Also: the absorbed result equals the
expanded (naive) MLA attention after W_UV, paged == contiguous, == attention_with_kvcache used as
MQA with one (d_c + d_rope)-wide key head whose first d_c columns are the value.
"""

import pytest
import torch

import attn_ops
from kvcache_reference import shuffled_block_table, slots_for
from mla_reference import (absorb_query, apply_w_uv, mla_cache_append_ref_, mla_decode_expanded_ref,
                           mla_decode_ref, mla_inputs, paged_mla_cache_append_ref_)
from reference import assert_close_to_ref, same_dtype_ref
from test_kvcache_append import assert_buffers_equal

ALL_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
F32_BF16 = [torch.float32, torch.bfloat16]
TIGHT = {torch.float32: 1e-5, torch.float64: 1e-10, torch.bfloat16: 1e-2, torch.float16: 2e-3}

# (d_c, d_rope): DeepSeek-V2/V3 (512 + 64 = 576) and a small shape
SHAPES = {"dc512_dr64": (512, 64), "dc32_dr16": (32, 16)}
LAYOUT_IDS = ["contig", "paged1", "paged64"]
BLOCK = {"contig": None, "paged1": 1, "paged16": 16, "paged64": 64}


def dtype_id(dt):
    return str(dt).replace("torch.", "")


def scale_for(d_c, d_rope):
    # DeepSeek: 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim) = 1 / sqrt(128 + 64) at 512 / 64
    return 192 ** -0.5 if d_c == 512 else (d_c + d_rope) ** -0.5


# --------------------------------------------------------------------------------------------------
# Append helpers
# --------------------------------------------------------------------------------------------------
def make_new_tokens(lead, d_c, d_rope, dtype, device, layout="contiguous"):
    """c_kv [*lead, d_c], k_pe [*lead, d_rope] in a given memory layout (stride-1 last dim).

    contiguous : two tensors
    split      : views of one [*lead, d_c + d_rope] projection output (as DeepSeek's kv_a_proj
                 output split into compressed_kv and k_pe): row stride d_c + d_rope
    transposed : built with the first two dims swapped, then transposed back (3-D only)
    """
    if layout == "contiguous":
        return (torch.randn(*lead, d_c, dtype=dtype, device=device),
                torch.randn(*lead, d_rope, dtype=dtype, device=device))
    if layout == "split":
        kv = torch.randn(*lead, d_c + d_rope, dtype=dtype, device=device)
        return kv[..., :d_c], kv[..., d_c:]
    if layout == "transposed":
        assert len(lead) == 2
        return (torch.randn(lead[1], lead[0], d_c, dtype=dtype, device=device).transpose(0, 1),
                torch.randn(lead[1], lead[0], d_rope, dtype=dtype, device=device).transpose(0, 1))
    raise ValueError(layout)


def make_cache(shape, dtype, device, layout="contiguous"):
    """(latent_cache, buffer): random cache of the given shape, itself or the first shape[-1]
    columns of a wider buffer ("sliced")."""
    if layout == "contiguous":
        c = torch.randn(*shape, dtype=dtype, device=device)
        return c, c
    if layout == "sliced":
        buf = torch.randn(*shape[:-1], shape[-1] + 5, dtype=dtype, device=device)
        return buf[..., :shape[-1]], buf
    raise ValueError(layout)


def expected_buffer(cache, buf, ref_fn, *args):
    exp = buf.clone()
    view = exp.as_strided(cache.size(), cache.stride(), cache.storage_offset())
    ref_fn(view, *args)
    return exp


def check_append(cache, buf, c_kv, k_pe, *, cache_seqlens=None, slot_mapping=None):
    if slot_mapping is None:
        exp = expected_buffer(cache, buf, mla_cache_append_ref_, c_kv, k_pe, cache_seqlens)
    else:
        exp = expected_buffer(cache, buf, paged_mla_cache_append_ref_, c_kv, k_pe, slot_mapping)
    ins = [t for t in (c_kv, k_pe, cache_seqlens, slot_mapping) if t is not None]
    before = [t.clone() for t in ins]
    ptr = cache.data_ptr()
    res = attn_ops.mla_cache_append(cache, c_kv, k_pe, cache_seqlens=cache_seqlens,
                                    slot_mapping=slot_mapping)
    assert res is None
    assert cache.data_ptr() == ptr
    for t, b in zip(ins, before):
        assert torch.equal(t, b), "the op modified an input (cache_seqlens is the caller's)"
    assert_buffers_equal([buf], [exp])


# --------------------------------------------------------------------------------------------------
# mla_cache_append, contiguous cache
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("tnew", [0, 1, 3])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_append_contiguous(dtype, tnew, shape, device):
    d_c, d_rope = SHAPES[shape]
    cap = 24
    lens = [0, 7, 19 - tnew, cap - tnew]  # rows of different lengths; the last one filled exactly
    B = len(lens)
    cache, buf = make_cache((B, cap, d_c + d_rope), dtype, device)
    c_kv, k_pe = make_new_tokens((B, tnew), d_c, d_rope, dtype, device)
    sl = torch.tensor(lens, dtype=torch.int32, device=device)
    check_append(cache, buf, c_kv, k_pe, cache_seqlens=sl)


@pytest.mark.parametrize("cache_layout", ["contiguous", "sliced"])
@pytest.mark.parametrize("new_layout", ["split", "transposed"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_append_contiguous_views(dtype, new_layout, cache_layout, device):
    d_c, d_rope, cap, lens, tnew = 512, 64, 20, [3, 0, 15], 5
    cache, buf = make_cache((3, cap, d_c + d_rope), dtype, device, cache_layout)
    c_kv, k_pe = make_new_tokens((3, tnew), d_c, d_rope, dtype, device, new_layout)
    assert not c_kv.is_contiguous() and not k_pe.is_contiguous()
    sl = torch.tensor(lens, dtype=torch.int32, device=device)
    check_append(cache, buf, c_kv, k_pe, cache_seqlens=sl)


def test_append_full_cache_zero_new(device):
    cache, buf = make_cache((2, 8, 48), torch.float32, device)
    c_kv, k_pe = make_new_tokens((2, 0), 32, 16, torch.float32, device)
    check_append(cache, buf, c_kv, k_pe,
                 cache_seqlens=torch.tensor([8, 8], dtype=torch.int32, device=device))


def test_append_noncontiguous_seqlens(device):
    cache, buf = make_cache((3, 16, 48), torch.float32, device)
    c_kv, k_pe = make_new_tokens((3, 2), 32, 16, torch.float32, device)
    sl = torch.tensor([4, 99, 0, 99, 14, 99], dtype=torch.int32, device=device)[::2]
    check_append(cache, buf, c_kv, k_pe, cache_seqlens=sl)


def test_append_step_by_step_builds_the_sequence(device):
    """Appending chunks (the caller advancing cache_seqlens) gives [cat(c_kv) ; cat(k_pe)]."""
    B, cap, d_c, d_rope = 3, 40, 512, 64
    cache = torch.randn(B, cap, d_c + d_rope, device=device)
    before = cache.clone()
    sl = torch.zeros(B, dtype=torch.int32, device=device)
    cs, ks = [], []
    for t in (5, 1, 1, 0, 7, 1):
        c_kv, k_pe = make_new_tokens((B, t), d_c, d_rope, torch.float32, device, "split")
        attn_ops.mla_cache_append(cache, c_kv, k_pe, cache_seqlens=sl)
        sl += t
        cs.append(c_kv)
        ks.append(k_pe)
    n = int(sl[0])
    assert torch.equal(cache[:, :n, :d_c], torch.cat(cs, 1))
    assert torch.equal(cache[:, :n, d_c:], torch.cat(ks, 1))
    assert torch.equal(cache[:, n:], before[:, n:])


# --------------------------------------------------------------------------------------------------
# mla_cache_append, paged cache
# --------------------------------------------------------------------------------------------------
def paged_setup(block_size, lens, tnews, d_c, d_rope, dtype, device, *, skip_every=0,
                slot_dtype=torch.int32, cache_layout="contiguous", new_layout="contiguous"):
    """A paged latent cache (shuffled block tables) and the tokens of a step appending tnews[b]
    tokens to row b (lens[b] long), in shuffled order. Returns (cache, buf, c_kv, k_pe, slots)."""
    B = len(lens)
    need = max(l + t for l, t in zip(lens, tnews))
    mb = max(1, -(-need // block_size))
    nb = B * mb + 2
    bt = shuffled_block_table(B, mb, nb)
    cache, buf = make_cache((nb, block_size, d_c + d_rope), dtype, device, cache_layout)
    pairs = [(b, lens[b] + t) for b in range(B) for t in range(tnews[b])]
    slots = slots_for(bt, block_size, pairs)
    slots = [slots[i] for i in torch.randperm(len(slots)).tolist()]
    if skip_every:
        slots = [-1 if i % skip_every == 1 else s for i, s in enumerate(slots)]
    c_kv, k_pe = make_new_tokens((len(slots),), d_c, d_rope, dtype, device, new_layout)
    return cache, buf, c_kv, k_pe, torch.tensor(slots, dtype=slot_dtype, device=device)


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64], ids=dtype_id)
@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_append_paged(dtype, block_size, slot_dtype, device):
    # prefill-like (20 tokens), decode-like (1) and empty steps; every third token skipped (-1)
    lens, tnews = [0, 5, 63, 17], [20, 1, 2, 0]
    cache, buf, c_kv, k_pe, slots = paged_setup(block_size, lens, tnews, 512, 64, dtype, device,
                                                skip_every=3, slot_dtype=slot_dtype)
    assert (slots == -1).any() and (slots >= 0).any()
    check_append(cache, buf, c_kv, k_pe, slot_mapping=slots)


@pytest.mark.parametrize("cache_layout", ["contiguous", "sliced"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_append_paged_views(dtype, cache_layout, device):
    cache, buf, c_kv, k_pe, slots = paged_setup(16, [3, 30], [9, 4], 32, 16, dtype, device,
                                                skip_every=4, cache_layout=cache_layout,
                                                new_layout="split")
    assert not c_kv.is_contiguous()
    check_append(cache, buf, c_kv, k_pe, slot_mapping=slots)


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64], ids=dtype_id)
def test_append_paged_all_skipped_and_empty(slot_dtype, device):
    cache, buf, c_kv, k_pe, slots = paged_setup(16, [3, 4], [2, 3], 32, 16, torch.float32, device,
                                                slot_dtype=slot_dtype)
    check_append(cache, buf, c_kv, k_pe, slot_mapping=torch.full_like(slots, -1))
    check_append(cache, buf, c_kv[:0], k_pe[:0], slot_mapping=slots[:0])


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64], ids=dtype_id)
def test_append_paged_first_and_last_slot(slot_dtype, device):
    for bs in (1, 64):
        nb = 5
        cache, buf = make_cache((nb, bs, 48), torch.float32, device)
        c_kv, k_pe = make_new_tokens((3,), 32, 16, torch.float32, device)
        slots = torch.tensor([nb * bs - 1, 0, -1], dtype=slot_dtype, device=device)
        check_append(cache, buf, c_kv, k_pe, slot_mapping=slots)


def test_append_paged_noncontiguous_slots(device):
    cache, buf, c_kv, k_pe, slots = paged_setup(16, [3, 40], [5, 6], 32, 16, torch.float32, device)
    spread = torch.full((2 * slots.numel(),), 12345, dtype=slots.dtype, device=device)
    spread[::2] = slots
    check_append(cache, buf, c_kv, k_pe, slot_mapping=spread[::2])


def test_append_torch_ops_path(device):
    cache, buf = make_cache((2, 8, 48), torch.float32, device)
    c_kv, k_pe = make_new_tokens((2, 3), 32, 16, torch.float32, device)
    sl = torch.tensor([1, 5], dtype=torch.int32, device=device)
    exp = expected_buffer(cache, buf, mla_cache_append_ref_, c_kv, k_pe, sl)
    assert torch.ops.attn_ops.mla_cache_append(cache, c_kv, k_pe, cache_seqlens=sl) is None
    assert_buffers_equal([buf], [exp])
    cache, buf, c_kv, k_pe, slots = paged_setup(16, [3, 40], [5, 6], 32, 16, torch.float32, device)
    exp = expected_buffer(cache, buf, paged_mla_cache_append_ref_, c_kv, k_pe, slots)
    assert torch.ops.attn_ops.mla_cache_append.default(cache, c_kv, k_pe,
                                                       slot_mapping=slots) is None
    assert_buffers_equal([buf], [exp])


@pytest.mark.parametrize("layout", ["contig", "paged16"])
def test_latent_cache_holds_dc_plus_drope_per_token(layout, device):
    """The whole per-token cache state is one row of d_c + d_rope = 576 values shared by all heads
    (DeepSeek-V3: 128 heads, qk_nope 128, qk_rope 64, v 128 would expand to 128 * (192 + 128); the
    bytes_per_token of the caches that compute it are checked in tests/test_nn_mla.py)."""
    H, d_c, d_rope, B, cap = 128, 512, 64, 2, 32
    dtype = torch.bfloat16
    if layout == "contig":
        cache = torch.zeros(B, cap, d_c + d_rope, dtype=dtype, device=device)
        c_kv, k_pe = make_new_tokens((B, 5), d_c, d_rope, dtype, device, "split")
        attn_ops.mla_cache_append(cache, c_kv, k_pe,
                                  cache_seqlens=torch.zeros(B, dtype=torch.int32, device=device))
        tokens, bt = B * cap, None
    else:
        nb, bs = 6, 16
        cache = torch.zeros(nb, bs, d_c + d_rope, dtype=dtype, device=device)
        bt = shuffled_block_table(B, 2, nb, device)
        slots = torch.tensor(slots_for(bt, bs, [(b, t) for b in range(B) for t in range(5)]),
                             device=device)
        c_kv, k_pe = make_new_tokens((B * 5,), d_c, d_rope, dtype, device, "split")
        attn_ops.mla_cache_append(cache, c_kv, k_pe, slot_mapping=slots)
        tokens = nb * bs
    # one row of d_c + d_rope values per token slot, and nothing else (no per-head K/V)
    assert cache.shape[-1] == d_c + d_rope == 576
    assert cache.numel() == tokens * 576
    assert cache.untyped_storage().nbytes() == tokens * 576 * cache.element_size()
    # decoding all H heads from that one row gives the reference's values
    q_latent = torch.randn(B, 1, H, d_c, dtype=dtype, device=device)
    q_rope = torch.randn(B, 1, H, d_rope, dtype=dtype, device=device)
    sl = torch.full((B,), 5, dtype=torch.int32, device=device)
    check_mla(q_latent, q_rope, cache, sl, bt, scale=192 ** -0.5)


# --------------------------------------------------------------------------------------------------
# mla_decode
# --------------------------------------------------------------------------------------------------
def check_mla(ql, qr, cache, sl, bt=None, *, scale, causal=True):
    """Run the op, check shapes/dtypes/contiguity/inputs untouched, compare with the reference."""
    ins = [t for t in (ql, qr, cache, sl, bt) if t is not None]
    before = [t.clone() for t in ins]
    out, lse = attn_ops.mla_decode(ql, qr, cache, sl, scale=scale, block_table=bt, causal=causal)
    for t, b in zip(ins, before):
        assert torch.equal(t, b), "the op modified an input"
    B, Tq, H, d_c = ql.shape
    assert tuple(out.shape) == (B, Tq, H, d_c)
    assert tuple(lse.shape) == (B, H, Tq)
    assert out.dtype == ql.dtype
    assert lse.dtype == (torch.float64 if ql.dtype == torch.float64 else torch.float32)
    assert out.device == ql.device and lse.device == ql.device
    assert out.is_contiguous()
    kw = dict(scale=scale, block_table=bt, causal=causal)
    r_out, r_lse = mla_decode_ref(ql, qr, cache, sl, **kw)
    s_out, s_lse = same_dtype_ref(mla_decode_ref, ql, qr, cache, sl, **kw, compute_dtype=ql.dtype)
    assert_close_to_ref(out, r_out, s_out, name="out_latent")
    assert_close_to_ref(lse, r_lse, s_lse, name="lse")
    return out, lse


def run_case(B_lens, tq, H, shape, layout, dtype, device, causal=True, **kw):
    d_c, d_rope = SHAPES[shape] if isinstance(shape, str) else shape
    ql, qr, cache, sl, bt, _ = mla_inputs(len(B_lens), tq, H, d_c, d_rope, B_lens, dtype=dtype,
                                          device=device, block_size=BLOCK[layout], **kw)
    return check_mla(ql, qr, cache, sl, bt, scale=scale_for(d_c, d_rope), causal=causal)


# name: (Tq, H, shape, lens, layout, causal)
CASES = {
    "decode_h16_contig": (1, 16, "dc512_dr64", [37, 0, 100], "contig", True),
    "decode_h16_paged64": (1, 16, "dc512_dr64", [37, 1, 100], "paged64", True),
    "decode_h128_contig": (1, 128, "dc512_dr64", [9, 0, 20], "contig", True),
    "tq2_h128_paged64": (2, 128, "dc512_dr64", [70, 2], "paged64", True),
    "tq2_h16_paged1_small": (2, 16, "dc32_dr16", [5, 30, 0, 1], "paged1", True),
    "tq2_h1_contig_small_full": (2, 1, "dc32_dr16", [1, 13, 0], "contig", False),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_decode_dtypes(case, dtype, device):
    tq, H, shape, lens, layout, causal = CASES[case]
    run_case(lens, tq, H, shape, layout, dtype, device, causal=causal)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("H", [1, 16, 128])
@pytest.mark.parametrize("tq", [1, 2])
@pytest.mark.parametrize("layout", LAYOUT_IDS)
@pytest.mark.parametrize("dtype", F32_BF16, ids=dtype_id)
def test_decode_sweep(dtype, layout, tq, H, shape, device):
    # lengths around the block size 64, a row of length 1 and an empty row
    run_case([0, 1, 17, 64, 65, 130], tq, H, shape, layout, dtype, device)


@pytest.mark.parametrize("layout", ["contig", "paged64"])
@pytest.mark.parametrize("tq", [1, 2])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_decode_long_cache(dtype, tq, layout, device):
    # one row, 2000 latent rows: the kernel must split the keys across threads
    run_case([2000], tq, 16, "dc512_dr64", layout, dtype, device, capacity=2048)


@pytest.mark.parametrize("layout", ["contig", "paged64"])
@pytest.mark.parametrize("dtype", F32_BF16, ids=dtype_id)
def test_decode_long_cache_h128(dtype, layout, device):
    # the DeepSeek-V3 decode shape: 128 heads over one 576-wide key head
    run_case([1200], 1, 128, "dc512_dr64", layout, dtype, device, capacity=1280)


@pytest.mark.parametrize("layout", ["contig", "paged64"])
def test_decode_long_and_short_rows(layout, device):
    run_case([1999, 0, 1, 700], 1, 16, "dc512_dr64", layout, torch.float32, device)


@pytest.mark.parametrize("layout", LAYOUT_IDS)
@pytest.mark.parametrize("tq", [1, 2])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_decode_empty_rows(dtype, tq, layout, device):
    d_c, d_rope = 32, 16
    ql, qr, cache, sl, bt, _ = mla_inputs(3, tq, 4, d_c, d_rope, [0, 12, 0], dtype=dtype,
                                          device=device, block_size=BLOCK[layout])
    for causal in (True, False):
        out, lse = check_mla(ql, qr, cache, sl, bt, scale=0.3, causal=causal)
        for b in (0, 2):
            assert (out[b] == 0).all()
            assert torch.isneginf(lse[b]).all()
        assert torch.isfinite(lse[1]).all()


@pytest.mark.parametrize("layout", ["contig", "paged64"])
def test_decode_all_rows_empty(layout, device):
    ql, qr, cache, sl, bt, _ = mla_inputs(2, 2, 16, 512, 64, [0, 0], device=device,
                                          block_size=BLOCK[layout])
    out, lse = attn_ops.mla_decode(ql, qr, cache, sl, scale=0.1, block_table=bt)
    assert tuple(out.shape) == (2, 2, 16, 512) and (out == 0).all()
    assert tuple(lse.shape) == (2, 16, 2) and torch.isneginf(lse).all()


@pytest.mark.parametrize("layout", ["contig", "paged1", "paged16"])
def test_decode_cache_shorter_than_tq(layout, device):
    # cache_seqlens[0] = 1 < Tq = 2: query 0 sits before position 0 and (causal) sees no key
    ql, qr, cache, sl, bt, _ = mla_inputs(2, 2, 16, 32, 16, [1, 2], device=device,
                                          block_size=BLOCK[layout])
    out, lse = check_mla(ql, qr, cache, sl, bt, scale=0.2)
    assert (out[0, 0] == 0).all() and torch.isneginf(lse[0, :, 0]).all()
    assert torch.isfinite(lse[0, :, 1]).all() and torch.isfinite(lse[1]).all()
    check_mla(ql, qr, cache, sl, bt, scale=0.2, causal=False)


@pytest.mark.parametrize("scale", [0.0, -0.3, 1.0, 2.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=dtype_id)
def test_decode_scale_and_large_logits(dtype, scale, device):
    # scale 0: uniform average; 2.5 at d_c = 512: logits of several hundred (no overflow)
    ql, qr, cache, sl, bt, _ = mla_inputs(2, 2, 16, 512, 64, [33, 90], dtype=dtype, device=device,
                                          block_size=16)
    check_mla(ql, qr, cache, sl, bt, scale=scale)


def test_decode_causal_is_default(device):
    ql, qr, cache, sl, bt, _ = mla_inputs(2, 2, 16, 32, 16, [7, 40], device=device, block_size=16)
    a = attn_ops.mla_decode(ql, qr, cache, sl, scale=0.2, block_table=bt)
    b = attn_ops.mla_decode(ql, qr, cache, sl, scale=0.2, block_table=bt, causal=True)
    c = attn_ops.mla_decode(ql, qr, cache, sl, scale=0.2, block_table=bt, causal=False)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert not torch.equal(a[0], c[0])


# --------------------------------------------------------------------------------------------------
# The absorbed form equals the expanded (naive) MLA attention
# --------------------------------------------------------------------------------------------------
def expanded_problem(B_lens, tq, H, d_c, d_rope, d_nope, d_v, layout, dtype, device):
    """q_nope, q_rope, W_UK [H, d_nope, d_c], W_UV [H, d_v, d_c], the cache; q_latent =
    W_UK^T q_nope in the input dtype (computed in float64, rounded once)."""
    _, qr, cache, sl, bt, _ = mla_inputs(len(B_lens), tq, H, d_c, d_rope, B_lens, dtype=dtype,
                                         device=device, block_size=BLOCK[layout])
    q_nope = torch.randn(len(B_lens), tq, H, d_nope, dtype=torch.float64, device=device)
    w_uk = torch.randn(H, d_nope, d_c, dtype=torch.float64, device=device) / d_nope ** 0.5
    w_uv = torch.randn(H, d_v, d_c, dtype=torch.float64, device=device) / d_c ** 0.5
    ql = absorb_query(q_nope, w_uk).to(dtype)
    return q_nope, qr, w_uk, w_uv, ql, cache, sl, bt


@pytest.mark.parametrize("tq", [1, 2])
@pytest.mark.parametrize("layout", ["contig", "paged16"])
def test_reference_equals_expanded_form(layout, tq, device):
    """Self-check of mla_reference: W_UV (direct absorbed reference) == naive MLA in float64."""
    d_c, d_rope, d_nope, d_v, H = 512, 64, 128, 128, 16
    q_nope, qr, w_uk, w_uv, ql, cache, sl, bt = expanded_problem(
        [0, 1, 40, 77], tq, H, d_c, d_rope, d_nope, d_v, layout, torch.float64, device)
    scale = (d_nope + d_rope) ** -0.5
    for causal in (True, False):
        o_lat, lse = mla_decode_ref(ql, qr, cache, sl, scale=scale, block_table=bt, causal=causal)
        e_out, e_lse = mla_decode_expanded_ref(q_nope, qr, w_uk, w_uv, cache, sl, scale=scale,
                                               block_table=bt, causal=causal)
        torch.testing.assert_close(apply_w_uv(o_lat, w_uv), e_out, rtol=1e-10, atol=1e-10)
        assert torch.equal(torch.isneginf(lse), torch.isneginf(e_lse))
        torch.testing.assert_close(lse, e_lse, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("layout", ["contig", "paged1", "paged64"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_op_equals_expanded_form(dtype, layout, device):
    """W_UV applied to the op's out_latent == naive MLA attention (expanded per-head K/V through
    reference.attention_ref). The expanded side takes q_nope in float64 while the op takes q_latent
    rounded to its dtype: float64 is compared with the expanded form directly (tolerance rule);
    the other dtypes with the absorbed float64 reference on the rounded q_latent, in the d_v space
    (tolerance rule), and loosely with the expanded form (the q_latent rounding moves it)."""
    d_c, d_rope, d_nope, d_v, H, tq = 512, 64, 128, 128, 16, 2
    q_nope, qr, w_uk, w_uv, ql, cache, sl, bt = expanded_problem(
        [0, 3, 50, 129], tq, H, d_c, d_rope, d_nope, d_v, layout, dtype, device)
    scale = (d_nope + d_rope) ** -0.5
    out, lse = attn_ops.mla_decode(ql, qr, cache, sl, scale=scale, block_table=bt)
    e_out, e_lse = mla_decode_expanded_ref(q_nope, qr, w_uk, w_uv, cache, sl, scale=scale,
                                           block_table=bt)
    r_lat, r_lse = mla_decode_ref(ql, qr, cache, sl, scale=scale, block_table=bt)
    s_lat, s_lse = same_dtype_ref(mla_decode_ref, ql, qr, cache, sl, scale=scale, block_table=bt,
                                  compute_dtype=dtype)
    ours = apply_w_uv(out.to(torch.float64), w_uv)
    same = apply_w_uv(s_lat.to(torch.float64), w_uv)
    if dtype == torch.float64:
        # exact same inputs: ours vs the expanded form directly
        assert_close_to_ref(ours, e_out, same, name="W_UV out_latent vs expanded")
        assert_close_to_ref(lse, e_lse, s_lse, name="lse vs expanded")
    else:
        # ours vs the float64 absorbed reference on the rounded q_latent, in the expanded (d_v) space
        assert_close_to_ref(ours, apply_w_uv(r_lat, w_uv), same, name="W_UV out_latent")
        assert_close_to_ref(lse, r_lse, s_lse, name="lse")
        # and the rounding of q_latent moves the expanded result only by a low-precision amount
        tol = {torch.float32: 1e-4, torch.float16: 5e-2, torch.bfloat16: 2e-1}[dtype]
        torch.testing.assert_close(ours, e_out, rtol=tol, atol=tol)


# --------------------------------------------------------------------------------------------------
# Cross-checks: paged == contiguous; == attention_with_kvcache (MQA with one 576-wide key head)
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("tq", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
def test_paged_equals_contiguous(dtype, tq, block_size, device):
    lens, cap, d_c, d_rope = [0, 1, 17, 64, 200], 256, 512, 64
    ql, qr, dense, sl, _, _ = mla_inputs(len(lens), tq, 16, d_c, d_rope, lens, dtype=dtype,
                                         device=device, capacity=cap)
    mb, nb = cap // block_size, len(lens) * (cap // block_size) + 3
    bt = shuffled_block_table(len(lens), mb, nb, device)
    assert (bt.reshape(-1)[:-1] + 1 != bt.reshape(-1)[1:]).any(), "block table is not shuffled"
    paged = torch.randn(nb, block_size, d_c + d_rope, dtype=dtype, device=device)
    paged[bt.long().reshape(-1)] = dense.reshape(-1, block_size, d_c + d_rope)
    for causal in (True, False):
        c = check_mla(ql, qr, dense, sl, scale=0.07, causal=causal)
        p = check_mla(ql, qr, paged, sl, bt, scale=0.07, causal=causal)
        for x, y in zip(p, c):
            torch.testing.assert_close(x, y, rtol=TIGHT[dtype], atol=TIGHT[dtype])


@pytest.mark.parametrize("layout", ["contig", "paged16"])
@pytest.mark.parametrize("tq", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
def test_equals_attention_with_kvcache(dtype, tq, layout, device):
    """MLA decode is MQA with one key head [c_kv ; k_pe] whose first d_c features are the value."""
    d_c, d_rope = 512, 64
    ql, qr, cache, sl, bt, _ = mla_inputs(3, tq, 16, d_c, d_rope, [0, 5, 90], dtype=dtype,
                                          device=device, block_size=BLOCK[layout])
    for causal in (True, False):
        out, lse = check_mla(ql, qr, cache, sl, bt, scale=0.05, causal=causal)
        q = torch.cat([ql, qr], dim=-1)
        a_out, a_lse = attn_ops.attention_with_kvcache(
            q, cache.unsqueeze(2), cache[..., :d_c].unsqueeze(2), sl, block_table=bt, scale=0.05,
            causal=causal)
        torch.testing.assert_close(out, a_out, rtol=TIGHT[dtype], atol=TIGHT[dtype])
        torch.testing.assert_close(lse, a_lse, rtol=TIGHT[dtype], atol=TIGHT[dtype])


# --------------------------------------------------------------------------------------------------
# Layouts, block tables, API paths, decode loop
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layouts", [("transposed", "contiguous"), ("sliced", "sliced"),
                                     ("contiguous", "sliced")], ids=lambda l: "-".join(l))
@pytest.mark.parametrize("layout", ["contig", "paged16"])
@pytest.mark.parametrize("dtype", F32_BF16, ids=dtype_id)
def test_decode_strided_views(dtype, layout, layouts, device):
    ql, qr, cache, sl, bt, _ = mla_inputs(3, 2, 16, 512, 64, [20, 0, 45], dtype=dtype,
                                          device=device, block_size=BLOCK[layout],
                                          q_layout=layouts[0], cache_layout=layouts[1])
    assert not (ql.is_contiguous() and cache.is_contiguous())
    out, lse = check_mla(ql, qr, cache, sl, bt, scale=0.06)
    c_out, c_lse = attn_ops.mla_decode(ql.contiguous(), qr.contiguous(), cache.contiguous(), sl,
                                       scale=0.06, block_table=bt)
    torch.testing.assert_close(out, c_out, rtol=TIGHT[dtype], atol=TIGHT[dtype])
    torch.testing.assert_close(lse, c_lse, rtol=TIGHT[dtype], atol=TIGHT[dtype])


def test_decode_noncontiguous_seqlens_and_block_table(device):
    ql, qr, cache, sl, bt, _ = mla_inputs(3, 1, 16, 32, 16, [20, 0, 45], device=device,
                                          block_size=16)
    sl2 = torch.stack([sl, torch.full_like(sl, 10 ** 6)], 1)[:, 0]
    bt2 = torch.stack([bt, torch.full_like(bt, -5)], 2)[:, :, 0]
    assert not sl2.is_contiguous() and not bt2.is_contiguous()
    check_mla(ql, qr, cache, sl2, bt2, scale=0.2)


def test_decode_shared_blocks_between_rows(device):
    # two rows whose tables point at the same blocks (prefix sharing) read the same latent rows
    ql, qr, cache, sl, bt, _ = mla_inputs(2, 1, 16, 32, 16, [40, 40], device=device,
                                          block_size=16, capacity=48)
    bt[1] = bt[0]
    ql[1], qr[1] = ql[0], qr[0]
    out, lse = check_mla(ql, qr, cache, sl, bt, scale=0.2)
    torch.testing.assert_close(out[1], out[0], rtol=0, atol=0)
    torch.testing.assert_close(lse[1], lse[0], rtol=0, atol=0)


def test_decode_torch_ops_path_matches_wrapper(device):
    ql, qr, cache, sl, bt, _ = mla_inputs(2, 2, 16, 32, 16, [20, 45], device=device, block_size=16)
    kw = dict(block_table=bt, causal=True, scale=0.2)
    a = attn_ops.mla_decode(ql, qr, cache, sl, **kw)
    b = torch.ops.attn_ops.mla_decode(ql, qr, cache, sl, **kw)
    c = torch.ops.attn_ops.mla_decode.default(ql, qr, cache, sl, **kw)
    for x in (b, c):
        torch.testing.assert_close(x[0], a[0], rtol=0, atol=0)
        torch.testing.assert_close(x[1], a[1], rtol=0, atol=0)


@pytest.mark.parametrize("layout", ["contig", "paged16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_append_then_decode_loop(dtype, layout, device):
    """Prefill chunk, then decode steps: append [c_kv ; k_pe], decode with the advanced lengths;
    every step matches the reference on the reference-appended cache."""
    B, H, d_c, d_rope, cap = 2, 16, 512, 64, 32
    scale = 192 ** -0.5
    if layout == "contig":
        cache = torch.randn(B, cap, d_c + d_rope, dtype=dtype, device=device)
        bt = None
    else:
        bs, nb = 16, 7
        cache = torch.randn(nb, bs, d_c + d_rope, dtype=dtype, device=device)
        bt = shuffled_block_table(B, cap // bs, nb, device)
    ref_cache = cache.clone()
    sl = torch.tensor([0, 3], dtype=torch.int32, device=device)
    for tnew in (6, 1, 1, 2, 1):
        c_kv, k_pe = make_new_tokens((B, tnew), d_c, d_rope, dtype, device, "split")
        ql = torch.randn(B, tnew, H, d_c, dtype=dtype, device=device)
        qr = torch.randn(B, tnew, H, d_rope, dtype=dtype, device=device)
        if bt is None:
            attn_ops.mla_cache_append(cache, c_kv, k_pe, cache_seqlens=sl)
            mla_cache_append_ref_(ref_cache, c_kv, k_pe, sl)
        else:
            pairs = [(b, int(sl[b]) + t) for b in range(B) for t in range(tnew)]
            slots = torch.tensor(slots_for(bt, bs, pairs), dtype=torch.int64, device=device)
            attn_ops.mla_cache_append(cache, c_kv.flatten(0, 1), k_pe.flatten(0, 1),
                                      slot_mapping=slots)
            paged_mla_cache_append_ref_(ref_cache, c_kv.flatten(0, 1), k_pe.flatten(0, 1), slots)
        assert torch.equal(cache, ref_cache)
        sl += tnew
        check_mla(ql, qr, cache, sl, bt, scale=scale)
