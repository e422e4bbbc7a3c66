"""CUDA smoke tests: a few small cases of every op family, fast enough to run under
compute-sanitizer (benchmarks/gpu/gpu_check.sh runs this file under memcheck, and the test named
test_racecheck_attention under racecheck). Skipped without a GPU.

The checks are the full test modules' own helpers (float64 reference, tolerance rule
max|ours - ref64| <= 2 * max|same_dtype - ref64| + eps, inputs untouched, exact cache writes); this
file only picks small shapes that together cover every kernel path:
- attention forward + backward: dense (Tq != Tk, lengths off the tile sizes), varlen with empty
  sequences, causal, sliding window, softcap, GQA and MQA, transposed views, every head dim of the
  tensor-core tiles (64, 96, 128, 192/128, 256, 576/512) plus ones only the row kernels take (32,
  80), in bfloat16, float16 and float32;
- attention_with_kvcache: contiguous, paged with block size 16 and 1, decode and Tq > 1;
- kv_cache_append / paged_kv_cache_append (block 16 and 1) and mla_cache_append bit-exact (their
  rejections of bad values trap on the device: test_cuda_device_checks.py runs them in child processes);
- rotary_embedding in place and out of place (both conventions, gradient too);
- mla_decode at 576/512, contiguous and paged (block 64 and 1).
"""

import pytest
import torch

import attn_ops
from kvcache_reference import kv_cache_append_ref_, kvcache_inputs, paged_kv_cache_append_ref_
from reference import (accumulation_dtype, assert_close_to_ref, attention_ref, dense_inputs, same_dtype_ref,
                       varlen_inputs)
from rope_reference import rope_ref
from test_attention_backward import check_backward, op_grads, ref_grads, same_dtype_grads
from test_attention_forward import check_forward
from test_attention_with_kvcache import check_kvcache
from test_mla_ops import check_append, make_cache, make_new_tokens, paged_setup, run_case
from test_rotary import check_against_ref, make_positions, make_x, tables

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")

DEV = "cuda"
BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32


def dtype_id(dt):
    return str(dt).replace("torch.", "")


# --------------------------------------------------------------------------------------------------
# attention forward + backward
# --------------------------------------------------------------------------------------------------
# (Dqk, Dv): the tensor-core tiles and two head dims only the row kernels take
HEAD_DIMS = [(32, 32), (64, 64), (80, 80), (96, 96), (128, 128), (192, 128), (256, 256), (576, 512)]


@pytest.mark.parametrize("dims", HEAD_DIMS, ids=lambda d: f"{d[0]}_{d[1]}")
def test_attention_head_dims(dims):
    dqk, dv = dims
    q, k, v = dense_inputs(2, 37, 70, 4, 2, dqk, dv, BF16, DEV)   # Tq != Tk, off the tile sizes
    check_forward(q, k, v, causal=True)
    check_backward(q, k, v, causal=True)


# name: (B, Tq, Tk, Hq, Hkv, D, dtype, layouts, kwargs)
CASES = {
    "mha_full_f32": (2, 33, 33, 2, 2, 64, F32, None, {}),
    "gqa_causal_f16": (2, 65, 130, 8, 2, 128, F16, None, dict(causal=True)),
    "mqa_causal_bf16": (1, 130, 130, 4, 1, 128, BF16, None, dict(causal=True)),
    "window_bf16": (2, 70, 70, 4, 2, 64, BF16, None, dict(window_left=16, window_right=4)),
    "causal_window_softcap_bf16": (1, 64, 96, 4, 2, 128, BF16, None,
                                   dict(causal=True, window_left=20, softcap=5.0, scale=0.3)),
    "decode_row_tq1_bf16": (3, 1, 200, 8, 2, 128, BF16, None, dict(causal=True)),
    "transposed_views_bf16": (2, 48, 48, 4, 2, 64, BF16, ("transposed", "transposed", "sliced"),
                              dict(causal=True)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_attention_cases(case):
    B, Tq, Tk, Hq, Hkv, D, dtype, layouts, kw = CASES[case]
    q, k, v = dense_inputs(B, Tq, Tk, Hq, Hkv, D, D, dtype, DEV, layouts or ("contiguous",) * 3)
    check_forward(q, k, v, **kw)
    check_backward(q, k, v, **kw)


@pytest.mark.parametrize("dtype", [BF16, F32], ids=dtype_id)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_varlen(causal, dtype):
    # an empty query sequence, an empty key sequence (rows see no key), lengths off the tiles
    q, k, v, cq, ck = varlen_inputs([5, 0, 70, 33], [9, 40, 0, 64], 4, 2, 128, 128, dtype, DEV)
    kw = dict(causal=causal, cu_seqlens_q=cq, cu_seqlens_k=ck)
    check_forward(q, k, v, **kw)
    check_backward(q, k, v, **kw)


def test_racecheck_attention():
    """The one small case gpu_check.sh runs under compute-sanitizer --tool racecheck: forward on the
    tensor-core path with split-KV and its merge, and backward, on the GPU; the references on the
    CPU, so that racecheck (slow on shared-memory-heavy kernels) checks little besides ours."""
    kw = dict(causal=True)
    q, k, v = dense_inputs(1, 8, 700, 8, 2, 128, 128, BF16, DEV)
    dout = torch.randn(1, 8, 8, 128, dtype=BF16, device=DEV)
    out, lse = attn_ops.attention(q, k, v, **kw)
    grads = op_grads(q, k, v, dout, None, **kw)
    cpu = [t.cpu() for t in (q, k, v, dout)]
    r_out, r_lse = attention_ref(*cpu[:3], **kw)
    s_out, s_lse = same_dtype_ref(attention_ref, *cpu[:3], **kw, compute_dtype=BF16)
    assert_close_to_ref(out, r_out, s_out, name="out")
    assert_close_to_ref(lse, r_lse, s_lse, name="lse")
    r64 = ref_grads(*cpu, None, torch.float64, **kw)
    same = same_dtype_grads(*cpu, None, **kw)
    for name, g, r, s_ in zip(("dq", "dk", "dv"), grads, r64, same):
        assert_close_to_ref(g, r, s_, name=name, rounded_intermediates=True)


# --------------------------------------------------------------------------------------------------
# attention_with_kvcache
# --------------------------------------------------------------------------------------------------
# name: (Tq, Hq, Hkv, D, lens, block_size, dtype, kwargs)
KV_CASES = {
    "decode_contig_bf16": (1, 8, 2, 128, [37, 1, 300], None, BF16, {}),
    "decode_paged16_bf16": (1, 8, 2, 128, [37, 0, 300], 16, BF16, {}),
    "decode_paged1_f16": (1, 4, 1, 64, [5, 70], 1, F16, {}),
    "chunk_tq3_paged16_f32": (3, 4, 2, 64, [3, 50], 16, F32, dict(softcap=8.0)),
    "chunk_tq4_contig_window_bf16": (4, 8, 8, 128, [40, 9], None, BF16,
                                     dict(causal=False, window_left=8, window_right=2)),
}


@pytest.mark.parametrize("case", list(KV_CASES))
def test_attention_with_kvcache(case):
    Tq, Hq, Hkv, D, lens, bs, dtype, kw = KV_CASES[case]
    q, kc, vc, sl, bt = kvcache_inputs(len(lens), Tq, Hq, Hkv, D, D, lens, dtype=dtype, device=DEV,
                                       block_size=bs)
    check_kvcache(q, kc, vc, sl, bt, **kw)


# --------------------------------------------------------------------------------------------------
# cache appends
# --------------------------------------------------------------------------------------------------
def test_kv_cache_append_exact():
    kc, vc = torch.randn(3, 24, 2, 128, dtype=BF16, device=DEV), torch.randn(3, 24, 2, 128, dtype=BF16,
                                                                             device=DEV)
    k, v = torch.randn(3, 4, 2, 128, dtype=BF16, device=DEV), torch.randn(3, 4, 2, 128, dtype=BF16,
                                                                          device=DEV)
    lens = torch.tensor([0, 7, 20], dtype=torch.int32, device=DEV)   # the last row filled exactly
    ek, ev = kc.clone(), vc.clone()
    kv_cache_append_ref_(ek, ev, k, v, lens)
    attn_ops.kv_cache_append(kc, vc, k, v, lens)
    assert torch.equal(kc, ek) and torch.equal(vc, ev)


@pytest.mark.parametrize("block_size", [16, 1])
def test_paged_kv_cache_append_exact(block_size):
    nb = 64 // block_size + 2
    kc = torch.randn(nb, block_size, 2, 64, dtype=BF16, device=DEV)
    vc = torch.randn(nb, block_size, 2, 64, dtype=BF16, device=DEV)
    n = 20
    slots = torch.randperm(nb * block_size, device=DEV)[:n].to(torch.int32)
    slots[3] = -1                                                    # skipped token
    k, v = torch.randn(n, 2, 64, dtype=BF16, device=DEV), torch.randn(n, 2, 64, dtype=BF16, device=DEV)
    ek, ev = kc.clone(), vc.clone()
    paged_kv_cache_append_ref_(ek, ev, k, v, slots)
    attn_ops.paged_kv_cache_append(kc, vc, k, v, slots)
    assert torch.equal(kc, ek) and torch.equal(vc, ev)


def test_mla_cache_append_exact():
    cache, buf = make_cache((3, 24, 576), BF16, DEV)
    c_kv, k_pe = make_new_tokens((3, 2), 512, 64, BF16, DEV)
    check_append(cache, buf, c_kv, k_pe,
                 cache_seqlens=torch.tensor([0, 5, 22], dtype=torch.int32, device=DEV))
    for block_size in (64, 1):
        cache, buf, c_kv, k_pe, slots = paged_setup(block_size, [0, 5, 63], [20, 1, 2], 512, 64,
                                                    BF16, DEV, skip_every=3)
        check_append(cache, buf, c_kv, k_pe, slot_mapping=slots)


# --------------------------------------------------------------------------------------------------
# rotary embedding
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("interleaved", [False, True], ids=["halfsplit", "interleaved"])
@pytest.mark.parametrize("dtype", [BF16, F32], ids=dtype_id)
def test_rotary(dtype, interleaved):
    lead, H, D, rd = (2, 7), 4, 128, 64                              # partial rotary: 64 of 128
    cos, sin = tables(rd, torch.float32, DEV)
    pos = make_positions(lead, torch.int64, DEV)
    x = make_x("transposed", lead, H, D, dtype, DEV)
    out = attn_ops.rotary_embedding(x, cos, sin, pos, interleaved=interleaved)
    check_against_ref(out, x, cos, sin, pos, interleaved=interleaved)
    y = x.clone()
    attn_ops.rotary_embedding_(y, cos, sin, pos, interleaved=interleaved)
    assert torch.equal(y, out)
    xs = x.detach().requires_grad_()
    g = torch.randn(x.shape, dtype=dtype, device=DEV)
    (dx,) = torch.autograd.grad(attn_ops.rotary_embedding(xs, cos, sin, pos,
                                                          interleaved=interleaved), xs, g)
    # the gradient is the inverse rotation of g; the features past rotary_dim pass through
    ref64, same = (rope_ref(g, cos, sin, pos, interleaved=interleaved, inverse=True,
                            compute_dtype=cdt) for cdt in (torch.float64, accumulation_dtype(dtype)))
    same = same.to(dtype)  # the rule's baseline: float32, rounded once
    assert_close_to_ref(dx, ref64, same, name="dx")
    assert torch.equal(dx[..., rd:], g[..., rd:])


# --------------------------------------------------------------------------------------------------
# mla_decode (576 / 512)
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout,tq,H", [("contig", 1, 16), ("paged64", 1, 128), ("paged1", 2, 16),
                                         ("contig", 3, 128)])
def test_mla_decode(layout, tq, H):
    run_case([37, 0, 130], tq, H, "dc512_dr64", layout, BF16, DEV)
