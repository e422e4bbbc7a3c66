"""The CPU decode kernel (csrc/attention/cpu/decode_*.cpp) against the float64 reference.

attention_with_kvcache and mla_decode run each sequence with at most 32 query rows per KV head
(Tq x Hq / Hkv <= 32) on the decode kernel and the others on the tiled prefill kernel (a packed
serving batch may mix both kinds in one call). The decode kernel has two
row kernels, picked per sequence by its rows per KV head: below 8 it streams K/V through register
dot products, from 8 on (MLA, large groups) it runs each key tile as two BLAS GEMMs on the tile in
place (float32 / float64, evenly spaced rows) or on a converted copy; the cases cover both sides
of 8 in every dtype. Both are compiled once per instruction set (portable at::vec, AVX2, AVX-512) and picked at
run time from PyTorch's CPU capability, which ATEN_CPU_CAPABILITY (and ATTN_OPS_CPU_ISA) lowers:
test_each_instruction_set reruns this file's cases in a subprocess for every capability this CPU has, so each
path meets the reference.

Cases per dtype: GQA groups 1 / 4 / all, head dims that are not a multiple of any vector width,
paged caches, key splits (one long row), Tq > 1 with windows and soft-capping, rows with no
visible key, the largest row count the kernel takes (32; 128 with one KV head, whose rows go to the
GEMM path) and the first it leaves (33; 129), MLA's
576 / 512 shared latent row, NaN propagation, the streaming kernel's key tiles (lengths around
64, paged block sizes 1 / 7 / 16 / 64, groups 1-4), the bfloat16 kernel's 32-column chunks (head dims with
and without a partial last chunk) and mixed decode + prefill batches.
"""

import os
import subprocess
import sys
import zlib

import pytest
import torch

import attn_ops
from cpu_isa_helpers import ISA_LEVELS, isa_levels_of_this_cpu
from kvcache_reference import attention_with_kvcache_ref, kvcache_inputs
from mla_reference import mla_decode_ref, mla_inputs
from reference import assert_close_to_ref, same_dtype_ref
from serving_reference import attention_with_kvcache_serving_ref

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
HERE = os.path.dirname(os.path.abspath(__file__))


def dtype_id(dt):
    return str(dt).replace("torch.", "")


def check(q, kc, vc, lens, bt=None, **kw):
    out, lse = attn_ops.attention_with_kvcache(q, kc, vc, lens, block_table=bt, **kw)
    r_out, r_lse = attention_with_kvcache_ref(q, kc, vc, lens, block_table=bt, **kw)
    s_out, s_lse = same_dtype_ref(attention_with_kvcache_ref, q, kc, vc, lens, block_table=bt, **kw,
                                  compute_dtype=q.dtype)
    assert_close_to_ref(out, r_out, s_out, name="out")
    assert_close_to_ref(lse, r_lse, s_lse, name="lse")
    return out, lse


# name: (B, Tq, Hq, Hkv, Dk, Dv, lens, block_size, kwargs)
CASES = {
    "gqa4_d128": (3, 1, 16, 4, 128, 128, [300, 1, 77], None, {}),
    "mha_d40": (2, 1, 3, 3, 40, 40, [65, 130], None, {}),
    "mqa32_d72_paged16": (2, 1, 32, 1, 72, 72, [200, 33], 16, {}),
    "dk96_dv24_paged1": (2, 1, 4, 2, 96, 24, [17, 64], 1, {}),
    "long_row_splits": (1, 1, 8, 2, 64, 64, [3001], None, {}),
    "long_row_splits_paged64": (1, 1, 4, 1, 32, 32, [2500], 64, {}),
    "tq3_window_softcap": (2, 3, 8, 2, 64, 64, [90, 5], None,
                           dict(causal=False, window_left=20, window_right=1, softcap=5.0)),
    "tq4_causal_rows32": (2, 4, 16, 2, 64, 64, [70, 3], 16, {}),
    "tq3_rows33_tiled": (1, 3, 22, 2, 64, 64, [50], None, {}),
    "mqa_tq2_rows128_gemm": (1, 2, 64, 1, 64, 64, [90], None, {}),
    "mqa_tq3_rows129_tiled": (1, 3, 43, 1, 64, 64, [90], None, {}),
    "empty_rows": (3, 1, 4, 2, 64, 64, [0, 9, 0], None, {}),
    # Around the GEMM kernel's threshold of 8 rows per KV head.
    "rows7_stream": (2, 1, 7, 1, 64, 64, [130, 64], None, {}),
    "rows8_gemm_dk80_dv48": (2, 1, 16, 2, 80, 48, [150, 7], None, {}),
    "rows16_gemm_splits": (1, 1, 16, 1, 64, 64, [3001], None, {}),
    "rows16_gemm_paged64": (2, 1, 16, 1, 32, 32, [300, 129], 64, {}),
    "rows16_gemm_empty_rows": (3, 1, 16, 1, 64, 64, [0, 9, 0], None, {}),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_decode_kernel_cases(case, dtype):
    torch.manual_seed(zlib.crc32(case.encode()))  # not hash(): randomized per process, a failure could not be rerun
    B, Tq, Hq, Hkv, Dk, Dv, lens, bs, kw = CASES[case]
    q, kc, vc, seqlens, bt = kvcache_inputs(B, Tq, Hq, Hkv, Dk, Dv, lens, dtype=dtype, block_size=bs)
    check(q, kc, vc, seqlens, bt, **kw)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("block_size", [None, 64])
def test_mla_decode_latent_rows(dtype, block_size):
    """MLA: 576-wide keys and 512-wide values from one latent row, 16 heads."""
    torch.manual_seed(1)
    ql, qr, cache, lens, bt, _ = mla_inputs(2, 1, 16, 512, 64, [700, 40], dtype=dtype,
                                            block_size=block_size)
    scale = 0.07
    out, lse = attn_ops.mla_decode(ql, qr, cache, lens, scale=scale, block_table=bt)
    r_out, r_lse = mla_decode_ref(ql, qr, cache, lens, scale=scale, block_table=bt)
    s_out, s_lse = same_dtype_ref(mla_decode_ref, ql, qr, cache, lens, scale=scale, block_table=bt,
                                  compute_dtype=dtype)
    assert_close_to_ref(out, r_out, s_out, name="out")
    assert_close_to_ref(lse, r_lse, s_lse, name="lse")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("hq", [8, 32], ids=["stream", "gemm"])
def test_nan_reaches_only_its_rows(dtype, where, hq):
    """A NaN in q reaches its head's row, in k every row of its KV head, in v one feature of them;
    the other KV head stays finite; with and without key splits; groups of 4 and 16 (both kernels)."""
    G = hq // 2
    for lens in ([150, 90], [3000, 2]):
        q, kc, vc, seqlens, _ = kvcache_inputs(2, 1, hq, 2, 64, 64, lens, dtype=dtype)
        t = {"q": q, "k": kc, "v": vc}[where]
        t[0, 0 if where == "q" else 100, 0, 5] = float("nan")
        out, lse = attn_ops.attention_with_kvcache(q, kc, vc, seqlens)
        if where == "q":
            assert torch.isnan(out[0, 0, 0]).all() and torch.isnan(lse[0, 0, 0])
            assert torch.isfinite(out[0, 0, 1:]).all() and torch.isfinite(lse[0, 1:]).all()
        elif where == "k":
            assert torch.isnan(out[0, 0, :G]).all() and torch.isnan(lse[0, :G]).all()
            assert torch.isfinite(out[0, 0, G:]).all() and torch.isfinite(lse[0, G:]).all()
        else:
            assert torch.isnan(out[0, 0, :G, 5]).all() and torch.isfinite(lse).all()
            assert torch.isfinite(out[0, 0, :G, :5]).all() and torch.isfinite(out[0, 0, G:]).all()
        assert torch.isfinite(out[1]).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("block_size", [None, 1, 7, 16, 64], ids=lambda b: f"paged{b}" if b else "contiguous")
@pytest.mark.parametrize("group", [1, 2, 3, 4])
@pytest.mark.parametrize("cache_layout", ["contiguous", "sliced", "transposed"])
def test_streaming_tiles_every_head(dtype, block_size, group, cache_layout):
    """The streaming kernel walks each key tile of all KV heads key by key: lengths around the 64-key
    tile and the 32-key one of 16-bit one-head items (0, 1, 31, 33, 63, 64, 65, 130), paged block sizes that
    do and do not divide them, 3 KV heads, groups whose 16 AVX-512 score accumulators are summed by one tree
    (1, 2, 4 rows) or one by one (3). Cache layouts: BSHD, whose items take every head and read each key's
    heads as one run (stream_tiles' staged reads); BSHD rows with a gap between heads ("sliced": the staged
    reads go head by head); heads' rows contiguous ("transposed": one head per item, prefetched)."""
    torch.manual_seed(group * 100 + (block_size or 0))
    lens = [0, 1, 31, 33, 63, 64, 65, 130]
    q, kc, vc, seqlens, bt = kvcache_inputs(len(lens), 1, 3 * group, 3, 64, 48, lens, dtype=dtype,
                                            block_size=block_size, cache_layout=cache_layout)
    check(q, kc, vc, seqlens, bt)


@pytest.fixture(params=["pairs", "float32"])
def bf16_score_products(request, monkeypatch):
    """The bfloat16 streaming kernel's two paths (decode_bf16_kernel.h): Q K^T and P V with vdpbf16ps on pairs
    where the CPU has AVX512-BF16 and no AMX (ATTN_OPS_CPU_AMX=0 stands in for "no AMX"), float32 FMAs on
    widened keys and values otherwise (ATTN_OPS_CPU_AVX512BF16=0). On a CPU without AVX512-BF16 both run the
    FMAs."""
    monkeypatch.setenv("ATTN_OPS_CPU_AMX", "0")
    monkeypatch.setenv("ATTN_OPS_CPU_AVX512BF16", "1" if request.param == "pairs" else "0")
    return request.param


@pytest.mark.parametrize("dk, dv", [(16, 16), (48, 80), (160, 256), (256, 24)])
@pytest.mark.parametrize("block_size", [None, 7])
def test_bfloat16_chunk_tails(dk, dv, block_size, bf16_score_products):
    """bfloat16 on AVX-512 streams its rows in chunks of 32 (decode_bf16_kernel.h: even / odd widening, the
    last partial chunk by a masked load): one partial chunk, pairs of chunks with and without a partial last
    one, an odd chunk count; row blocks of 1 to 5 rows (group 5); lengths around the 64-key tile."""
    torch.manual_seed(dk + dv)
    q, kc, vc, seqlens, bt = kvcache_inputs(3, 1, 10, 2, dk, dv, [1, 64, 130], dtype=torch.bfloat16,
                                            block_size=block_size)
    check(q, kc, vc, seqlens, bt)


@pytest.mark.parametrize("case", [c for c in CASES if "gemm" not in c and "tiled" not in c])
def test_bfloat16_score_paths_cases(case, bf16_score_products):
    """The streaming cases in bfloat16 on each Q K^T path: groups, windows, soft-capping, key splits, paged."""
    B, Tq, Hq, Hkv, Dk, Dv, lens, block_size, kw = CASES[case]
    torch.manual_seed(sum(lens) + Hq)
    q, kc, vc, seqlens, bt = kvcache_inputs(B, Tq, Hq, Hkv, Dk, Dv, lens, dtype=torch.bfloat16, block_size=block_size)
    check(q, kc, vc, seqlens, bt, **kw)


@pytest.mark.parametrize("scale", [0.0, 3.0, 1e-3])
def test_bfloat16_score_scales(scale, bf16_score_products):
    """The pairs path multiplies q as given and scales the sums (q / scale restores it): scales far from
    1 / sqrt(D), and 0 (uniform weights), which takes the FMA path."""
    torch.manual_seed(11)
    q, kc, vc, seqlens, bt = kvcache_inputs(2, 1, 8, 2, 64, 64, [70, 9], dtype=torch.bfloat16)
    check(q, kc, vc, seqlens, bt, scale=scale)


def assert_lse_keeps_float32_accuracy(rows, keys):
    """bfloat16 q [1, 1, rows, 64] and keys at logits ~15 (scale 0.01): lse within 1e-4 of the float64 one (rounding
    the scaled q to bfloat16 put 2^-9 of every logit into it, 0.05 here)."""
    q = (torch.randn(1, 1, rows, 64, dtype=torch.float64) * 10).bfloat16()
    k = (torch.randn(1, keys, 1, 64, dtype=torch.float64) * 10).bfloat16()
    v = torch.randn(1, keys, 1, 64).bfloat16()
    lens = torch.tensor([keys], dtype=torch.int32)
    _, lse = attn_ops.attention_with_kvcache(q, k, v, lens, scale=0.01)
    _, ref_lse = attention_with_kvcache_ref(q, k, v, lens, scale=0.01)
    assert (lse.double() - ref_lse).abs().max() < 1e-4 * ref_lse.abs().max()


def test_bfloat16_gemm_logits_keep_float32_accuracy_on_this_cpu():
    """The GEMM path (64 query rows per KV head) on the kernel this CPU picks by default: the AMX tiles where
    it has AMX-BF16 (decode_amx_kernel.h, which bf16_score_products turns off), else the pairs or the FMAs. q is
    packed as given and the scores scaled in float32."""
    torch.manual_seed(12)
    assert_lse_keeps_float32_accuracy(64, 70)


@pytest.mark.parametrize("rows", [4, 64], ids=["stream", "gemm"])
def test_bfloat16_logits_keep_float32_accuracy(rows, bf16_score_products):
    """The bfloat16 kernels multiply q as given (bfloat16: exact) and scale the float32 sums, so the lse stays at
    float32 accuracy. And a scale so small (1e-40) that q . k alone overflows float32 where
    scale * q . k does not keeps the scaled-q products (lse was NaN)."""
    assert_lse_keeps_float32_accuracy(rows, 5)
    q = (torch.randn(1, 1, rows, 64, dtype=torch.float64) * 1e4).bfloat16()
    k = (torch.randn(1, 50, 1, 64, dtype=torch.float64) * 1e36).bfloat16()
    v = torch.randn(1, 50, 1, 64).bfloat16()
    lens = torch.tensor([50], dtype=torch.int32)
    out, lse = attn_ops.attention_with_kvcache(q, k, v, lens, scale=1e-40)
    ref_out, ref_lse = attention_with_kvcache_ref(q, k, v, lens, scale=1e-40)
    # (the GEMM path rounds the scaled q to bfloat16 here: bfloat16-level accuracy)
    assert torch.isfinite(lse).all() and (lse.double() - ref_lse).abs().max() < 2 ** -8 * ref_lse.abs().max()


def packed_mixed_inputs(lens_q, lens_k, Hq, Hkv, D, dtype, block_size, pool_rows):
    """Packed q [sum(lens_q), Hq, D], a cache pool of pool_rows rows (paged when block_size is given),
    cache_seqlens and the serving keyword arguments (cu_seqlens_q, cache_batch_idx, cache_leftpad)."""
    B, capacity = len(lens_q), max(lens_k) + 9
    i32 = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    q = torch.randn(sum(lens_q), Hq, D, dtype=dtype)
    kw = {"cu_seqlens_q": i32([0] + torch.tensor(lens_q).cumsum(0).tolist()), "max_seqlen_q": max(lens_q),
          "cache_batch_idx": i32(torch.randperm(pool_rows)[:B].tolist()),
          "cache_leftpad": i32([min(3, L - T) for L, T in zip(lens_k, lens_q)])}
    if block_size is None:
        kc = torch.randn(pool_rows, capacity, Hkv, D, dtype=dtype)
        vc = torch.randn(pool_rows, capacity, Hkv, D, dtype=dtype)
    else:
        blocks = -(-capacity // block_size)
        kc = torch.randn(pool_rows * blocks + 2, block_size, Hkv, D, dtype=dtype)
        vc = torch.randn_like(kc)
        kw["block_table"] = torch.randperm(kc.shape[0])[:pool_rows * blocks].reshape(pool_rows, blocks).to(torch.int32)
    return q, kc, vc, i32(lens_k), kw


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("block_size", [None, 16])
def test_mixed_decode_and_prefill_rows_in_one_call(dtype, block_size):
    """A packed serving batch mixing decode rows (Tq x group <= 32: the decode kernel) with prefill
    chunks (the tiled kernel) and an empty row: each kind runs on its kernel over its own rows, the
    cache rows picked by cache_batch_idx, left-padded, contiguous or paged."""
    torch.manual_seed(5)
    lens_q, lens_k = [1, 40, 0, 2, 9, 1], [70, 90, 5, 66, 9, 1]
    q, kc, vc, seqlens, kw = packed_mixed_inputs(lens_q, lens_k, 8, 2, 32, dtype, block_size, pool_rows=8)
    out, lse = attn_ops.attention_with_kvcache(q, kc, vc, seqlens, **kw)
    ref_kw = {k: v for k, v in kw.items() if k != "max_seqlen_q"}
    r_out, r_lse = attention_with_kvcache_serving_ref(q, kc, vc, seqlens, **ref_kw)
    s_out, s_lse = same_dtype_ref(attention_with_kvcache_serving_ref, q, kc, vc, seqlens, **ref_kw,
                                  compute_dtype=dtype)
    assert_close_to_ref(out, r_out, s_out, name="out")
    assert_close_to_ref(lse, r_lse, s_lse, name="lse")


@pytest.mark.parametrize("lens", [[20, 7], [1500, 9]], ids=["below_threshold", "key_splits"])
def test_result_does_not_depend_on_the_thread_count(lens):
    """A call below the minimum-work threshold runs on one thread whatever the thread count; one above it with a
    long row splits that row's keys over the threads (B = 2 items for 2+ threads). Either way, 1 and 2 threads
    give the same result, each checked against the reference."""
    q, kc, vc, seqlens, _ = kvcache_inputs(2, 1, 4, 2, 64, 64, lens)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            results.append(check(q, kc, vc, seqlens))
    finally:
        torch.set_num_threads(threads)
    (out1, lse1), (out2, lse2) = results
    torch.testing.assert_close(out1, out2, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse1, lse2, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("isa", ISA_LEVELS)
def test_each_instruction_set(isa):
    """This file's cases again with PyTorch's CPU capability lowered to `isa` (a subprocess:
    the capability is read once per process)."""
    if isa not in isa_levels_of_this_cpu():
        pytest.skip(f"this CPU lacks {isa}")
    if os.environ.get("ATEN_CPU_CAPABILITY"):
        assert torch.backends.cpu.get_cpu_capability().lower() == os.environ["ATEN_CPU_CAPABILITY"]
        return
    env = dict(os.environ, ATEN_CPU_CAPABILITY=isa)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                          os.path.join(HERE, "test_decode_cpu.py")], env=env, cwd=os.path.dirname(HERE),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
