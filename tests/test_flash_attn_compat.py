"""attn_ops.flash_attn_interface, tested the way FlashAttention tests itself: over shape grids (written
here), every output (and gradient) must satisfy |ours - ref64| <= 2 * |pytorch_same_dtype - ref64| +
a small floor (reference.assert_close_to_ref), where ref64 is the float64 reference and
pytorch_same_dtype the same plain-PyTorch computation in the input dtype. FlashAttention 2
semantics checked: bottom-right causal, window_size tuples, softcap, return_attn_probs -> lse,
packed qkv / kv, varlen, and flash_attn_with_kvcache's cache_seqlens (length before the new tokens),
in-place append of k / v, rotary (FlashAttention's query positions), cache_batch_idx, cache_leftpad,
block_table. Unsupported features raise NotImplementedError; every function compiles fullgraph.
"""

import re

import pytest
import torch

from attn_ops.flash_attn_interface import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                                           flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                                           flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache)
from reference import accumulation_dtype, assert_close_to_ref, attention_ref, same_dtype_ref
from rope_reference import rope_ref
from serving_reference import attention_with_kvcache_serving_ref

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
FA_DTYPES = {"bf16": BF16, "f16": F16, "f32": F32}  # (bfloat16 alone let a 3% error pass at long Tk)
# (seqlen_q, seqlen_k): decode, Tq > Tk, Tq < Tk, odd lengths off every tile size
SEQLENS = [(1, 1), (1, 147), (113, 203), (240, 97), (3, 799)]
HEADS = {"mha": (4, 4), "gqa": (4, 2), "mqa": (4, 1)}
MASKS = {"none": dict(), "causal": dict(causal=True), "local": dict(window_size=(37, 11)),
         "causal_local": dict(causal=True, window_size=(50, -1)), "softcap": dict(causal=True, softcap=5.0)}
# FlashAttention 2's masks: also ALiBi, BLOOM-like (causal, one slope per head; Hq = 4 in every case below)
FA2_MASKS = dict(MASKS, alibi=dict(causal=True, alibi_slopes=torch.rand(4) * 0.2 + 0.01))


def fa_to_ref(kw):
    """FlashAttention keyword arguments -> reference.attention_ref's."""
    w = kw.get("window_size", (-1, -1))
    return dict(scale=kw.get("softmax_scale"), causal=kw.get("causal", False), window_left=w[0], window_right=w[1],
                softcap=kw.get("softcap", 0.0), alibi_slopes=kw.get("alibi_slopes"))


def check_fa_rule(ours, q, k, v, kw, *, lse=None, **varlen):
    ref = attention_ref(q, k, v, **fa_to_ref(kw), **varlen)
    same = same_dtype_ref(attention_ref, q, k, v, **fa_to_ref(kw), **varlen, compute_dtype=q.dtype)
    assert_close_to_ref(ours, ref[0], same[0], name="out")
    if lse is not None:
        assert_close_to_ref(lse, ref[1], same[1], name="lse")


@pytest.mark.parametrize("seqlens", SEQLENS, ids=str)
@pytest.mark.parametrize("d", [32, 128])
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("mask", FA2_MASKS)
@pytest.mark.parametrize("dtype", FA_DTYPES)
def test_flash_attn_func(dtype, seqlens, d, heads, mask):
    (tq, tk), (hq, hk) = seqlens, HEADS[heads]
    q, k, v = (torch.randn(2, t, h, d, dtype=FA_DTYPES[dtype]) for t, h in ((tq, hq), (tk, hk), (tk, hk)))
    out, lse, probs = flash_attn_func(q, k, v, return_attn_probs=True, **FA2_MASKS[mask])
    assert probs is None
    check_fa_rule(out, q, k, v, FA2_MASKS[mask], lse=lse)


@pytest.mark.parametrize("seqlens", [(1, 147), (113, 203), (240, 97)], ids=str)
@pytest.mark.parametrize("mask", ["causal", "local", "softcap", "alibi"])
@pytest.mark.parametrize("dtype", FA_DTYPES)
def test_flash_attn_func_backward(dtype, seqlens, mask):
    tq, tk = seqlens
    kw, dt = dict(FA2_MASKS[mask], softmax_scale=0.2), FA_DTYPES[dtype]
    q, k, v = (torch.randn(1, t, h, 64, dtype=dt, requires_grad=True) for t, h in ((tq, 4), (tk, 2), (tk, 2)))
    dout = torch.randn(1, tq, 4, 64, dtype=dt)
    grads = torch.autograd.grad(flash_attn_func(q, k, v, **kw), (q, k, v), dout)
    outs = {}
    # "same": float32 gradients of the same inputs, rounded once (test_attention_backward.same_dtype_grads)
    for name, cdt in (("ref", torch.float64), ("same", accumulation_dtype(dt))):
        leaves = [t.detach().to(cdt).requires_grad_() for t in (q, k, v)]
        o = attention_ref(*leaves, **fa_to_ref(kw), compute_dtype=cdt)[0]
        outs[name] = [g.to(dt) if name == "same" else g for g in torch.autograd.grad(o, leaves, dout.to(cdt))]
    for g, r, s, n in zip(grads, outs["ref"], outs["same"], "qkv"):
        assert_close_to_ref(g, r, s, name=f"d{n}", rounded_intermediates=True)


@pytest.mark.parametrize("lens", [[(1, 1), (0, 5), (113, 203), (30, 7)], [(128, 128), (17, 0), (1, 300)]], ids=str)
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("mask", ["none", "causal", "local", "alibi"])
@pytest.mark.parametrize("dtype", FA_DTYPES)
def test_flash_attn_varlen_func(dtype, lens, heads, mask):
    (hq, hk), d, dt = HEADS[heads], 64, FA_DTYPES[dtype]
    cu_q = torch.tensor([0] + [sum(a for a, _ in lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32)
    cu_k = torch.tensor([0] + [sum(b for _, b in lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32)
    q = torch.randn(int(cu_q[-1]), hq, d, dtype=dt)
    k, v = (torch.randn(int(cu_k[-1]), hk, d, dtype=dt) for _ in range(2))
    max_q, max_k = max(a for a, _ in lens), max(b for _, b in lens)
    kw = FA2_MASKS[mask]
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, return_attn_probs=True, **kw)
    check_fa_rule(out, q, k, v, kw, lse=lse, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)


def test_alibi_slopes_per_batch_row():
    """FlashAttention 2's [B, Hq] slopes: row b's heads use alibi_slopes[b] (a BLOOM batch with per-row slopes),
    through flash_attn_func and a flash_attn_with_kvcache step over a paged cache."""
    q, k, v = (torch.randn(3, t, 4, 32, dtype=BF16) for t in (40, 40, 40))
    kw = dict(causal=True, alibi_slopes=torch.rand(3, 4) * 0.2)
    check_fa_rule(flash_attn_func(q, k, v, **kw), q, k, v, kw)
    a = kvcache_case(BF16, tq=2, tnew=2, paged=True, batch_idx=True, leftpad=True, rotary=None)
    out = flash_attn_with_kvcache(**a, **kw)
    assert_close_to_ref(out, fa_kvcache_ref(a, kw, torch.float64)[0], fa_kvcache_ref(a, kw, BF16)[0], name="out")


def test_packed_variants_equal_unpacked():
    """The packed entry points read q / k / v as views of qkv / kv: the same result, bit for bit, and the
    gradient that reaches qkv is the unpacked call's gradients of q, k and v, stacked."""
    qkv = torch.randn(2, 50, 3, 4, 32, dtype=BF16, requires_grad=True)
    kw = dict(causal=True, window_size=(20, -1), softcap=3.0)
    q, k, v = qkv.unbind(2)
    plain = flash_attn_func(q, k, v, **kw)
    assert torch.equal(flash_attn_qkvpacked_func(qkv, **kw), plain)
    assert torch.equal(flash_attn_kvpacked_func(q, torch.stack([k, v], 2), **kw), plain)
    dout = torch.randn_like(plain)
    (dqkv,) = torch.autograd.grad(flash_attn_qkvpacked_func(qkv, **kw), qkv, dout)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    unpacked = torch.autograd.grad(flash_attn_func(*leaves, **kw), leaves, dout)
    assert torch.equal(dqkv, torch.stack(unpacked, 2))

    cu = torch.tensor([0, 20, 20, 70], dtype=torch.int32)
    qkv_t = torch.randn(70, 3, 4, 32, dtype=BF16)
    q, k, v = qkv_t.unbind(1)
    plain = flash_attn_varlen_func(q, k, v, cu, cu, 50, 50, **kw)
    assert torch.equal(flash_attn_varlen_qkvpacked_func(qkv_t, cu, 50, **kw), plain)
    assert torch.equal(flash_attn_varlen_kvpacked_func(q, torch.stack([k, v], 1), cu, cu, 50, 50, **kw), plain)


# --------------------------------------------------------------------------------------------------
# flash_attn_with_kvcache
# --------------------------------------------------------------------------------------------------
def kvcache_case(dtype, *, tq, tnew, paged, batch_idx, leftpad, rotary, B=3, hq=4, hk=2, d=64, capacity=64):
    rows = B + 2 if batch_idx else B
    lens = torch.randint(0, capacity - tnew - 1, (B,), dtype=torch.int32)
    a = dict(q=torch.randn(B, tq, hq, d, dtype=dtype), cache_seqlens=lens)
    if paged:
        bs = 16
        nb = rows * capacity // bs + 2
        a["block_table"] = torch.randperm(nb)[:rows * capacity // bs].reshape(rows, -1).to(torch.int32)
        a["k_cache"], a["v_cache"] = (torch.randn(nb, bs, hk, d, dtype=dtype) for _ in range(2))
    else:
        a["k_cache"], a["v_cache"] = (torch.randn(rows, capacity, hk, d, dtype=dtype) for _ in range(2))
    if tnew:
        a["k"], a["v"] = (torch.randn(B, tnew, hk, d, dtype=dtype) for _ in range(2))
    if batch_idx:
        a["cache_batch_idx"] = torch.randperm(rows)[:B].to(torch.int32)
    if leftpad:
        a["cache_leftpad"] = (lens * torch.rand(B)).to(torch.int32)
    if rotary:
        angles = torch.rand(capacity + tq, 16, dtype=torch.float64) * 6
        a["rotary_cos"], a["rotary_sin"] = angles.cos().to(dtype), angles.sin().to(dtype)
        a["rotary_interleaved"] = rotary == "interleaved"
    return a


def fa_kvcache_ref(a, kw, dt, attn_dt=None):
    """FlashAttention 2's flash_attn_with_kvcache in plain PyTorch, computed in dtype dt: (out, lse, k_cache,
    v_cache). With attn_dt, the attention runs in attn_dt and the rotations in float32, each rounded to dt once
    (as the op rounds them)."""
    q, kc, vc = a["q"].to(dt), a["k_cache"].to(dt).clone(), a["v_cache"].to(dt).clone()
    lens = a["cache_seqlens"].long()
    B, tq = q.shape[:2]
    rows = a.get("cache_batch_idx", torch.arange(B)).tolist()
    k, v = a.get("k"), a.get("v")
    tnew = 0 if k is None else k.shape[1]
    if "rotary_cos" in a:
        cos, sin, il = a["rotary_cos"], a["rotary_sin"], a["rotary_interleaved"]
        capacity = kc.shape[1] * (1 if "block_table" not in a else a["block_table"].shape[1])
        # FlashAttention drops a window side that spans the cache before it picks the query positions
        windowed = any(0 <= side < capacity for side in kw.get("window_size", (-1, -1)))
        step = 1 if kw.get("causal") or windowed else 0
        rope_dt = dt if attn_dt is None else torch.float32
        q = rope_ref(q, cos, sin, lens[:, None] + step * torch.arange(tq), interleaved=il, compute_dtype=rope_dt).to(dt)
        if k is not None:
            k = rope_ref(k, cos, sin, lens[:, None] + torch.arange(tnew), interleaved=il,
                         compute_dtype=rope_dt).to(dt)
    for b in range(B):
        for t in range(tnew):
            p = int(lens[b]) + t
            if "block_table" in a:
                bs = kc.shape[1]
                blk = int(a["block_table"][rows[b], p // bs])
                kc[blk, p % bs], vc[blk, p % bs] = k[b, t].to(dt), v[b, t].to(dt)
            else:
                kc[rows[b], p], vc[rows[b], p] = k[b, t].to(dt), v[b, t].to(dt)
    w = kw.get("window_size", (-1, -1))
    out, lse = attention_with_kvcache_serving_ref(
        q, kc, vc, (lens + tnew).to(torch.int32), block_table=a.get("block_table"),
        cache_batch_idx=a.get("cache_batch_idx"), cache_leftpad=a.get("cache_leftpad"), causal=kw.get("causal", False),
        window_left=w[0], window_right=w[1], softcap=kw.get("softcap", 0.0), alibi_slopes=kw.get("alibi_slopes"),
        compute_dtype=attn_dt or dt)
    return out, lse, kc, vc


# (rotary, mask) pairs: each rotary layout and each mask at least once, rotary with both query rules
# (consecutive positions when causal / windowed)
ROTARY_MASKS = [(None, "causal"), ("half", "local"), ("interleaved", "softcap"), ("interleaved", "none"),
                ("half", "alibi")]


# bfloat16 over the whole grid, float32 over a part of it (time budget)
KVCACHE_GRID = [(dtype, tq, tnew, paged, extras, rotary, mask)
                for dtype in (BF16, F32)
                for tq, tnew in ((1, 0), (1, 1), (4, 4), (5, 2))
                for paged in (False, True)
                for extras in ("none", "batch_idx", "leftpad", "both")
                for rotary, mask in ROTARY_MASKS
                if dtype == BF16 or (extras in ("none", "both") and tq != 5)]


@pytest.mark.parametrize("dtype,tq,tnew,paged,extras,rotary,mask", KVCACHE_GRID, ids=str)
def test_flash_attn_with_kvcache(dtype, tq, tnew, paged, extras, rotary, mask):
    a = kvcache_case(dtype, tq=tq, tnew=tnew, paged=paged, batch_idx=extras in ("batch_idx", "both"),
                     leftpad=extras in ("leftpad", "both"), rotary=rotary)
    kw = FA2_MASKS[mask]
    ref = fa_kvcache_ref(a, kw, torch.float64)
    same = fa_kvcache_ref(a, kw, dtype)
    out, lse = flash_attn_with_kvcache(**a, **kw, return_softmax_lse=True)
    assert_close_to_ref(out, ref[0], same[0], name="out")
    # lse's baseline (reference.same_dtype_ref): q and the new keys rotated and rounded to dtype, the attention in
    # float32
    same_lse = fa_kvcache_ref(a, kw, dtype, attn_dt=torch.float32)[1] if dtype != torch.float64 else same[1]
    assert_close_to_ref(lse, ref[1], same_lse, name="lse")
    # the new keys / values were written in place (rotated keys: rounded once, as the same-dtype reference)
    for ours, r, s, n in ((a["k_cache"], ref[2], same[2], "k_cache"), (a["v_cache"], ref[3], same[3], "v_cache")):
        assert_close_to_ref(ours, r, s, name=n)


@pytest.mark.parametrize("paged", [False, True])
def test_rotary_queries_with_a_window_spanning_the_cache(paged):
    """Non-causal, both window sides >= the cache capacity: FlashAttention treats that as no window, so every
    query is rotated at cache_seqlens (not at consecutive positions)."""
    a = kvcache_case(F32, tq=3, tnew=1, paged=paged, batch_idx=False, leftpad=False, rotary="half")
    kw = {"causal": False, "window_size": (64, 70)}
    ref, same = fa_kvcache_ref(a, kw, torch.float64), fa_kvcache_ref(a, kw, F32)
    out = flash_attn_with_kvcache(**a, **kw)
    assert_close_to_ref(out, ref[0], same[0], name="out")


def test_inputs_with_a_strided_last_dim():
    """FlashAttention's wrappers copy a q / k / v whose last dim is strided; so does the shim."""
    q, k, v = (torch.randn(2, 5, 4, 64)[..., ::2] for _ in range(3))
    assert q.stride(-1) == 2
    out = flash_attn_func(q, k, v, causal=True)
    ref = attention_ref(q, k, v, causal=True, compute_dtype=torch.float64)[0]
    assert_close_to_ref(out, ref, attention_ref(q, k, v, causal=True, compute_dtype=F32)[0])
    kc, vc = torch.randn(2, 16, 4, 32), torch.randn(2, 16, 4, 32)
    out = flash_attn_with_kvcache(q[:, :1], kc, vc, k[:, :1], v[:, :1], cache_seqlens=3)
    assert out.shape == (2, 1, 4, 32) and torch.equal(kc[:, 3], k[:, 0])


def test_cache_seqlens_int_and_full_cache():
    q, kc, vc = torch.randn(2, 1, 4, 32), torch.randn(2, 10, 2, 32), torch.randn(2, 10, 2, 32)
    full = flash_attn_with_kvcache(q, kc, vc)
    as_int = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=10)
    assert torch.equal(full, as_int)
    ref = attention_ref(q, kc, vc, compute_dtype=torch.float64)[0]
    assert_close_to_ref(full, ref, attention_ref(q, kc, vc, compute_dtype=F32)[0])


# --------------------------------------------------------------------------------------------------
# Unsupported features and torch.compile
# --------------------------------------------------------------------------------------------------
def test_unsupported_features_raise():
    q = torch.randn(1, 4, 2, 16)
    with pytest.raises(NotImplementedError, match="dropout_p > 0 is not supported, got 0.1"):
        flash_attn_func(q, q, q, dropout_p=0.1)
    q8 = q.to(torch.float8_e4m3fn)
    with pytest.raises(NotImplementedError, match="fp8 inputs are not supported, got torch.float8_e4m3fn"):
        flash_attn_func(q8, q8, q8)
    with pytest.raises(NotImplementedError, match="dropout_p > 0"):
        flash_attn_varlen_qkvpacked_func(torch.randn(4, 3, 2, 16), torch.tensor([0, 4], dtype=torch.int32), 4,
                                         dropout_p=0.5)


@pytest.mark.parametrize("case", ["unassigned_block", "past_the_table"])
def test_kvcache_paged_table_checked_before_the_append(case):
    """A block_table entry of -1 at offset block_size - 1 gave slot -1, which the append skips: the other rows'
    tokens were written before attention_with_kvcache rejected the table. Now nothing is written."""
    kc, vc = torch.randn(4, 4, 1, 8), torch.randn(4, 4, 1, 8)
    table = torch.tensor([[0, 1], [2, -1]], dtype=torch.int32)
    lens = torch.tensor([0, 7 if case == "unassigned_block" else 8], dtype=torch.int32)
    q, k, v = torch.randn(2, 1, 1, 8), torch.randn(2, 1, 1, 8), torch.randn(2, 1, 1, 8)
    before = kc.clone(), vc.clone()
    message = {"unassigned_block": "attn_ops.flash_attn_with_kvcache: block_table[1, 1] = -1 is out of range [0, 4)",
               "past_the_table": "attn_ops.flash_attn_with_kvcache: cache_seqlens[1] = 8 plus 1 new tokens exceeds the "
                                 "cache capacity 8 (block_table width 2 x block_size 4)"}[case]
    with pytest.raises(RuntimeError, match=re.escape(message)):
        flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, block_table=table, causal=True)
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])


def test_kvcache_paged_step_compiles_fullgraph():
    torch._dynamo.reset()
    a = kvcache_case(F32, tq=1, tnew=1, paged=True, batch_idx=False, leftpad=False, rotary=None)
    eager = {n: t.clone() if isinstance(t, torch.Tensor) else t for n, t in a.items()}
    step = torch.compile(flash_attn_with_kvcache, fullgraph=True)
    torch.testing.assert_close(step(**a), flash_attn_with_kvcache(**eager))
    assert torch.equal(a["k_cache"], eager["k_cache"]) and torch.equal(a["v_cache"], eager["v_cache"])


def test_compile_fullgraph():
    torch._dynamo.reset()
    q, k, v = torch.randn(2, 9, 4, 32), torch.randn(2, 12, 2, 32), torch.randn(2, 12, 2, 32)
    cu = torch.tensor([0, 9, 18], dtype=torch.int32)
    fns = {
        "func": (lambda: flash_attn_func(q, k, v, causal=True, window_size=(5, -1))),
        "qkvpacked": (lambda: flash_attn_qkvpacked_func(torch.stack([q, q, q], 2), causal=True)),
        "varlen": (lambda: flash_attn_varlen_func(q.flatten(0, 1), q.flatten(0, 1), q.flatten(0, 1), cu, cu, 9, 9)),
    }
    for name, fn in fns.items():
        torch.testing.assert_close(torch.compile(fn, fullgraph=True)(), fn(), msg=name)

    cos, sin = torch.rand(40, 16).cos(), torch.rand(40, 16).sin()
    lens, idx = torch.tensor([3, 7], dtype=torch.int32), torch.tensor([2, 0], dtype=torch.int32)

    def step(kc, vc, q1, k1, v1):
        return flash_attn_with_kvcache(q1, kc, vc, k1, v1, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens,
                                       cache_batch_idx=idx, causal=True, return_softmax_lse=True)

    kc, vc = torch.randn(3, 20, 2, 32), torch.randn(3, 20, 2, 32)
    new = (q[:, :1], k[:, :1], v[:, :1])
    kc_e, vc_e = kc.clone(), vc.clone()
    eager = step(kc_e, vc_e, *new)
    compiled = torch.compile(step, fullgraph=True)(kc, vc, *new)
    assert torch.equal(kc, kc_e) and torch.equal(vc, vc_e)
    torch.testing.assert_close(compiled, eager)
