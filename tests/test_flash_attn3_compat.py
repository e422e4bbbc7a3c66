"""attn_ops.flash_attn3_interface (FlashAttention 3's surface) against the float64 reference, under
FlashAttention's rule (reference.assert_close_to_ref): positional softmax_scale, return arities, seqused_q /
seqused_k, paged varlen, packed queries and new keys in flash_attn_with_kvcache, rotary_seqlens,
flash_attn_combine, out=, and a clear NotImplementedError for what attn_ops cannot honour. The functions
both modules offer run through both."""

import re

import pytest
import torch

import attn_ops.flash_attn3_interface as fa3
import attn_ops.flash_attn_interface as fa2
from attn_ops._flash_attn_kvcache import with_qv
from reference import assert_close_to_ref, attention_ref, same_dtype_ref
from test_flash_attn_compat import HEADS, MASKS, check_fa_rule, fa_kvcache_ref, kvcache_case

BF16, F32 = torch.bfloat16, torch.float32


def cu(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)


@pytest.mark.parametrize("module", ["fa2", "fa3"])
@pytest.mark.parametrize("seqlens", [(1, 147), (113, 203), (240, 97)], ids=str)
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("mask", MASKS)
def test_flash_attn_func_both_modules(module, seqlens, heads, mask):
    (tq, tk), (hq, hk) = seqlens, HEADS[heads]
    q, k, v = (torch.randn(2, t, h, 64, dtype=BF16) for t, h in ((tq, hq), (tk, hk), (tk, hk)))
    kw = dict(MASKS[mask], softmax_scale=0.3)
    if module == "fa2":
        out, lse, probs = fa2.flash_attn_func(q, k, v, return_attn_probs=True, **kw)
        assert probs is None
    else:
        out, lse = fa3.flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    check_fa_rule(out, q, k, v, kw, lse=lse)


def test_fa3_positional_scale_and_causal():
    """FA3 takes softmax_scale third and causal fourth (FA2: dropout_p, softmax_scale)."""
    q, k, v = (torch.randn(1, 9, 2, 32) for _ in range(3))
    assert torch.equal(fa3.flash_attn_func(q, k, v, 0.25, True), fa2.flash_attn_func(q, k, v, 0.0, 0.25, True))
    grads = torch.autograd.grad(fa3.flash_attn_func(*(t.requires_grad_() for t in (q, k, v)), 0.25, True).sum(),
                                (q, k, v))
    assert all(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("layout", ["5d", "4d_gqa"])
def test_fa3_qkvpacked(layout):
    q, k, v = torch.randn(2, 30, 4, 32), torch.randn(2, 30, 2, 32), torch.randn(2, 30, 2, 32)
    kw = dict(causal=True, window_size=(10, -1))
    if layout == "5d":
        k, v = k.repeat(1, 1, 2, 1), v.repeat(1, 1, 2, 1)
        out, lse = fa3.flash_attn_qkvpacked_func(torch.stack([q, k, v], 2), return_attn_probs=True, **kw)
    else:
        out, lse = fa3.flash_attn_qkvpacked_func(torch.cat([q, k, v], 2), num_heads_q=4, return_attn_probs=True, **kw)
    ref = fa3.flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    assert torch.equal(out, ref[0]) and torch.equal(lse, ref[1])


def _compact(x, cu_x, used):
    """The first used[b] tokens of each sequence of packed x, packed again, with their cu_seqlens."""
    keep = torch.cat([torch.arange(int(cu_x[b]), int(cu_x[b]) + int(used[b])) for b in range(len(used))])
    return x[keep], cu(used.tolist()), keep


@pytest.mark.parametrize("mask", ["none", "causal", "local", "softcap"])
@pytest.mark.parametrize("which", ["q", "k", "both"])
def test_fa3_varlen_seqused(which, mask):
    lens_q, lens_k = [5, 0, 17, 9], [12, 3, 20, 9]
    used_q = torch.tensor([3, 0, 17, 4], dtype=torch.int32) if which != "k" else None
    used_k = torch.tensor([12, 0, 7, 9], dtype=torch.int32) if which != "q" else None
    cq, ck = cu(lens_q), cu(lens_k)
    q = torch.randn(int(cq[-1]), 4, 32, dtype=BF16)
    k, v = (torch.randn(int(ck[-1]), 2, 32, dtype=BF16) for _ in range(2))
    kw = MASKS[mask]
    out, lse = fa3.flash_attn_varlen_func(q, k, v, cq, ck, 17, 20, used_q, used_k, return_attn_probs=True, **kw)
    uq = torch.tensor(lens_q, dtype=torch.int32) if used_q is None else used_q
    uk = torch.tensor(lens_k, dtype=torch.int32) if used_k is None else used_k
    qc, cqc, keep = _compact(q, cq, uq)
    kc, ckc, _ = _compact(k, ck, uk)
    vc, _, _ = _compact(v, ck, uk)
    check_fa_rule(out[keep], qc, kc, vc, kw, lse=lse[:, keep], cu_seqlens_q=cqc, cu_seqlens_k=ckc)
    unused = torch.ones(q.shape[0], dtype=torch.bool)
    unused[keep] = False
    assert torch.all(out[unused] == 0) and torch.all(lse[:, unused] == float("-inf"))


def test_fa3_varlen_batched_inputs_with_seqused_k():
    """cu_seqlens_q / cu_seqlens_k None: batched q / k / v, seqused_k the keys each row uses."""
    q, k, v = torch.randn(3, 4, 2, 16), torch.randn(3, 10, 2, 16), torch.randn(3, 10, 2, 16)
    used = torch.tensor([10, 1, 6], dtype=torch.int32)
    out, lse = fa3.flash_attn_varlen_func(q, k, v, None, None, None, None, seqused_k=used, causal=True,
                                          return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (3, 2, 4)
    for b in range(3):
        n = int(used[b])
        ref = attention_ref(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], causal=True, compute_dtype=torch.float64)
        same = attention_ref(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], causal=True, compute_dtype=F32)
        assert_close_to_ref(out[b:b + 1], ref[0], same[0], name=f"out[{b}]")
        assert_close_to_ref(lse[b:b + 1], ref[1], same[1], name=f"lse[{b}]")


@pytest.mark.parametrize("seqused_q", [False, True])
def test_fa3_varlen_paged(seqused_q):
    """page_table (extension): packed queries over a paged cache whose sequence b holds seqused_k[b] keys."""
    lens_q, used_k, bs = [1, 6, 3], torch.tensor([9, 30, 4], dtype=torch.int32), 8
    cq = cu(lens_q)
    used_q = torch.tensor([1, 4, 0], dtype=torch.int32) if seqused_q else None
    q = torch.randn(int(cq[-1]), 4, 32, dtype=BF16)
    kc, vc = (torch.randn(20, bs, 2, 32, dtype=BF16) for _ in range(2))
    table = torch.randperm(20)[:12].view(3, 4).to(torch.int32)
    kw = dict(causal=True, softcap=3.0)
    out, lse = fa3.flash_attn_varlen_func(q, kc, vc, cq, None, 6, None, used_q, used_k, return_attn_probs=True,
                                          page_table=table, **kw)
    flat = lambda c: torch.cat([c[table[b].long()].flatten(0, 1)[:int(used_k[b])] for b in range(3)])  # noqa: E731
    uq = torch.tensor(lens_q, dtype=torch.int32) if used_q is None else used_q
    qc, cqc, keep = _compact(q, cq, uq)
    check_fa_rule(out[keep], qc, flat(kc), flat(vc), kw, lse=lse[:, keep], cu_seqlens_q=cqc,
                  cu_seqlens_k=cu(used_k.tolist()))


# --------------------------------------------------------------------------------------------------
# flash_attn_with_kvcache
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tq,tnew", [(1, 1), (4, 4), (5, 2), (1, 0)], ids=str)
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("extras", ["none", "both"])
@pytest.mark.parametrize("rotary,mask", [(None, "causal"), ("half", "local"), ("interleaved", "softcap")])
def test_fa3_kvcache_matches_fa_reference(tq, tnew, paged, extras, rotary, mask):
    a = kvcache_case(BF16, tq=tq, tnew=tnew, paged=paged, batch_idx=extras == "both", leftpad=extras == "both",
                     rotary=rotary)
    kw = MASKS[mask]
    ref, same = fa_kvcache_ref(a, kw, torch.float64), fa_kvcache_ref(a, kw, BF16)
    args = {("page_table" if n == "block_table" else n): t for n, t in a.items()}
    out, lse, out_accum, lse_accum = fa3.flash_attn_with_kvcache(**args, **kw, return_softmax_lse=True)
    assert out_accum.numel() == 0 and lse_accum.numel() == 0
    assert_close_to_ref(out, ref[0], same[0], name="out")
    assert_close_to_ref(a["k_cache"], ref[2], same[2], name="k_cache")


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("rotary", [None, "half"])
def test_fa3_kvcache_packed_q_and_new_keys(paged, rotary):
    """cu_seqlens_q / cu_seqlens_k_new: rows with their own query and new-key counts give what one call per
    row gives (each checked against the FA reference)."""
    tq, tnew = [3, 1, 0], [2, 1, 0]
    a = kvcache_case(F32, tq=3, tnew=2, paged=paged, batch_idx=True, leftpad=False, rotary=rotary)
    cache0 = a["k_cache"].clone(), a["v_cache"].clone()
    q = torch.cat([a["q"][b, :n] for b, n in enumerate(tq)])
    k, v = (torch.cat([a[x][b, :n] for b, n in enumerate(tnew)]) for x in ("k", "v"))
    args = {("page_table" if n == "block_table" else n): t for n, t in a.items() if n not in ("q", "k", "v")}
    out, lse, *_ = fa3.flash_attn_with_kvcache(q, k=k, v=v, cu_seqlens_q=cu(tq), max_seqlen_q=3,
                                               cu_seqlens_k_new=cu(tnew), causal=True, return_softmax_lse=True,
                                               **args)
    offsets, caches = cu(tq), (cache0[0].clone(), cache0[1].clone())
    for b in range(3):
        row = dict(a, q=a["q"][b:b + 1, :tq[b]], k=a["k"][b:b + 1, :tnew[b]], v=a["v"][b:b + 1, :tnew[b]],
                   cache_seqlens=a["cache_seqlens"][b:b + 1], cache_batch_idx=a["cache_batch_idx"][b:b + 1],
                   k_cache=cache0[0].clone(), v_cache=cache0[1].clone())
        ref, same = fa_kvcache_ref(row, {"causal": True}, torch.float64), fa_kvcache_ref(row, {"causal": True}, F32)
        assert_close_to_ref(out[offsets[b]:offsets[b + 1]], ref[0][0], same[0][0], name=f"out row {b}")
        if tnew[b]:  # the same row through FA2 writes the same cache entries
            fa2.flash_attn_with_kvcache(**dict(row, k_cache=caches[0], v_cache=caches[1]), causal=True)
    assert torch.equal(a["k_cache"], caches[0]) and torch.equal(a["v_cache"], caches[1])


def test_fa3_kvcache_rotary_seqlens():
    """rotary_seqlens shifts the rotary positions: the same as FA2 with the tables shifted by as much."""
    a = kvcache_case(F32, tq=2, tnew=2, paged=False, batch_idx=False, leftpad=False, rotary="half")
    shift = 3
    cos, sin = a.pop("rotary_cos"), a.pop("rotary_sin")
    a2 = {n: t.clone() if isinstance(t, torch.Tensor) else t for n, t in a.items()}
    ours = fa3.flash_attn_with_kvcache(**a, rotary_cos=cos, rotary_sin=sin, causal=True,
                                       rotary_seqlens=a["cache_seqlens"] + shift)
    theirs = fa2.flash_attn_with_kvcache(**a2, rotary_cos=cos[shift:], rotary_sin=sin[shift:], causal=True)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(a["k_cache"], a2["k_cache"])


def test_fa3_combine_and_scheduler_metadata():
    """Two key halves' partials combined = attention over all keys; get_scheduler_metadata's result is
    accepted."""
    q, k, v = torch.randn(2, 3, 4, 32), torch.randn(2, 40, 4, 32), torch.randn(2, 40, 4, 32)
    parts = [fa3.flash_attn_func(q, k[:, s], v[:, s], return_attn_probs=True) for s in (slice(0, 17), slice(17, 40))]
    out_partial = torch.stack([p[0] for p in parts])
    lse_partial = torch.stack([p[1] for p in parts]).transpose(-1, -2)  # [splits, B, T, H]
    dest = torch.empty(2, 3, 4, 32, dtype=BF16)
    out, lse = fa3.flash_attn_combine(out_partial, lse_partial, out=dest, out_dtype=BF16)
    assert out is dest and lse.shape == (2, 3, 4)
    ref = attention_ref(q, k, v, compute_dtype=torch.float64)
    same = same_dtype_ref(attention_ref, q, k, v, compute_dtype=F32)
    assert_close_to_ref(fa3.flash_attn_combine(out_partial, lse_partial)[0], ref[0], same[0], name="out")
    assert_close_to_ref(lse.transpose(1, 2), ref[1], same[1], name="lse")
    lens = torch.tensor([5, 7], dtype=torch.int32)
    meta = fa3.get_scheduler_metadata(2, 1, 16, 4, 2, 32, lens, causal=True)
    kc, vc = torch.randn(2, 16, 2, 32), torch.randn(2, 16, 2, 32)
    q1 = torch.randn(2, 1, 4, 32)
    assert torch.equal(fa3.flash_attn_with_kvcache(q1, kc, vc, cache_seqlens=lens, scheduler_metadata=meta,
                                                   num_splits=4, pack_gqa=True),
                       fa2.flash_attn_with_kvcache(q1, kc, vc, cache_seqlens=lens))


def test_fa3_out_argument():
    q, k, v = torch.randn(2, 5, 2, 16), torch.randn(2, 7, 2, 16), torch.randn(2, 7, 2, 16)
    dest = torch.empty(2, 5, 2, 16)
    assert fa3.flash_attn_func(q, k, v, out=dest) is dest
    assert torch.equal(dest, fa3.flash_attn_func(q, k, v))
    with pytest.raises(ValueError, match=re.escape("out must have shape [2, 5, 2, 16], dtype torch.float32")):
        fa3.flash_attn_func(q, k, v, out=torch.empty(2, 5, 2, 8))
    c = cu([5, 5])
    dest = torch.empty(10, 2, 16)
    assert fa3.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), c, cu([7, 7]), 5, 7,
                                      out=dest) is dest
    dest = torch.empty(2, 1, 2, 16)
    assert fa3.flash_attn_with_kvcache(q[:, :1], k, v, out=dest) is dest


@pytest.mark.parametrize("name,kw,message", [
    ("flash_attn_func", {"q_descale": torch.ones(1)}, "q_descale (fp8 descaling) is not supported"),
    ("flash_attn_varlen_func", {"v_descale": torch.ones(1)}, "v_descale (fp8 descaling) is not supported"),
    ("flash_attn_with_kvcache", {"k_descale": torch.ones(1)}, "k_descale (fp8 descaling) is not supported"),
])
def test_fa3_unsupported_arguments_raise(name, kw, message):
    q = torch.randn(1, 4, 2, 16)
    args = {"flash_attn_func": (q, q, q), "flash_attn_qkvpacked_func": (torch.stack([q, q, q], 2),),
            "flash_attn_with_kvcache": (q, q, q),
            "flash_attn_varlen_func": (q[0], q[0], q[0], cu([4]), cu([4]), 4, 4)}[name]
    with pytest.raises(NotImplementedError, match=re.escape(message)):
        getattr(fa3, name)(*args, **kw)


def test_fa3_kvcache_packed_compiles_fullgraph():
    torch._dynamo.reset()
    kc, vc = torch.randn(3, 16, 2, 32), torch.randn(3, 16, 2, 32)
    q, k, v = torch.randn(4, 4, 32), torch.randn(3, 2, 32), torch.randn(3, 2, 32)
    cos, sin = torch.rand(40, 16).cos(), torch.rand(40, 16).sin()
    lens, idx = torch.tensor([3, 7], dtype=torch.int32), torch.tensor([2, 0], dtype=torch.int32)

    def step(kc, vc):
        return fa3.flash_attn_with_kvcache(q, kc, vc, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens,
                                           cache_batch_idx=idx, cu_seqlens_q=cu([3, 1]), max_seqlen_q=3,
                                           cu_seqlens_k_new=cu([2, 1]), causal=True)

    kc_e, vc_e = kc.clone(), vc.clone()
    eager = step(kc_e, vc_e)
    compiled = torch.compile(step, fullgraph=True)(kc, vc)
    assert torch.equal(kc, kc_e) and torch.equal(vc, vc_e)
    torch.testing.assert_close(compiled, eager)


def qv_ref(q, qv, k, v, scale, causal=False, compute_dtype=torch.float64):
    """FA3's qv scores written out: softmax(scale * (q k^T + qv v^T)) v, bottom-right causal; [B, T, H, D]
    inputs with one KV head shared by all query heads (MLA), float64."""
    q, qv, k, v = (t.to(compute_dtype) for t in (q, qv, k, v))
    s = (torch.einsum("bqhd,bkd->bhqk", q, k[:, :, 0]) + torch.einsum("bqhd,bkd->bhqk", qv, v[:, :, 0])) * scale
    if causal:
        tq, tk = s.shape[-2:]
        s = s.masked_fill(torch.ones(tq, tk, dtype=torch.bool).triu(tk - tq + 1), float("-inf"))
    return torch.einsum("bhqk,bkd->bqhd", torch.softmax(s, dim=-1), v[:, :, 0])


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_qv_mla_shapes_flash_attn_func(dtype, causal):
    """DeepSeek's absorbed shapes: q the rope part (64), qv the latent one (512), one KV head; value and
    gradients (qv included) against the written-out scores."""
    B, Tq, Tk, H = 2, 5, 9, 4
    q = torch.randn(B, Tq, H, 64, dtype=dtype, requires_grad=True)
    qv = torch.randn(B, Tq, H, 512, dtype=dtype, requires_grad=True)
    k = torch.randn(B, Tk, 1, 64, dtype=dtype, requires_grad=True)
    v = torch.randn(B, Tk, 1, 512, dtype=dtype, requires_grad=True)
    out = fa3.flash_attn_func(q, k, v, causal=causal, qv=qv)
    scale = (64 + 512) ** -0.5
    leaves64 = [t.detach().double().requires_grad_() for t in (q, qv, k, v)]
    ref = qv_ref(*leaves64[:2], *leaves64[2:], scale, causal)
    leaves32 = [t.detach().float().requires_grad_() for t in (q, qv, k, v)]
    same = qv_ref(*leaves32[:2], *leaves32[2:], scale, causal, compute_dtype=F32)
    assert_close_to_ref(out, ref, same.to(dtype), name="out")
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, qv, k, v), dout)
    g64 = torch.autograd.grad(ref, leaves64, dout.double())
    g32 = torch.autograd.grad(same, leaves32, dout.float())
    for name, g, r, s in zip(("dq", "dqv", "dk", "dv"), grads, g64, g32):
        assert_close_to_ref(g, r, s.to(dtype), name=name, rounded_intermediates=True)


@pytest.mark.parametrize("layout", ["latent_first", "rope_first", "separate"])
def test_qv_kvcache_over_a_latent_cache(layout):
    """flash_attn_with_kvcache with qv over an MLA cache: k_cache / v_cache as views of one [.., 576] buffer in
    either order (the keys then stay a view) or as two tensors (a copy), with new tokens appended; values and
    the appended cache rows against the written-out scores."""
    B, cap, H, lens = 2, 12, 4, torch.tensor([3, 7], dtype=torch.int32)
    buf = torch.randn(B, cap, 1, 576)
    if layout == "latent_first":
        v_cache, k_cache = buf[..., :512], buf[..., 512:]
    elif layout == "rope_first":
        k_cache, v_cache = buf[..., :64], buf[..., 64:]
    else:
        k_cache, v_cache = torch.randn(B, cap, 1, 64), torch.randn(B, cap, 1, 512)
    q, qv = torch.randn(B, 2, H, 64), torch.randn(B, 2, H, 512)
    k_new, v_new = torch.randn(B, 2, 1, 64), torch.randn(B, 2, 1, 512)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    keys = with_qv(q, qv, k_cache, v_cache)[1]
    assert (keys.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()) == (layout != "separate")
    out = fa3.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, qv=qv, cache_seqlens=lens, causal=True)
    for b, n in enumerate(lens.tolist()):
        k_row = torch.cat([k_before[b, :n], k_new[b]]).unsqueeze(0)
        v_row = torch.cat([v_before[b, :n], v_new[b]]).unsqueeze(0)
        assert torch.equal(k_cache[b, :n + 2], k_row[0]) and torch.equal(v_cache[b, :n + 2], v_row[0])
        scale = 576 ** -0.5
        ref = qv_ref(q[b:b + 1], qv[b:b + 1], k_row, v_row, scale, causal=True)
        same = qv_ref(q[b:b + 1], qv[b:b + 1], k_row, v_row, scale, causal=True, compute_dtype=F32)
        assert_close_to_ref(out[b:b + 1], ref, same, name=f"out row {b}")


def test_qv_of_the_wrong_shape_is_refused():
    q, k, v = torch.randn(1, 3, 2, 64), torch.randn(1, 5, 1, 64), torch.randn(1, 5, 1, 512)
    with pytest.raises(ValueError, match=re.escape("qv must have q's shape with v's head dim ([..., 2, 512]), "
                                                   "got [1, 3, 2, 128]")):
        fa3.flash_attn_func(q, k, v, qv=torch.randn(1, 3, 2, 128))


def test_qv_varlen_packed_sequences():
    """flash_attn_varlen_func with qv: two packed sequences, each against the written-out scores."""
    lq, lk, H = [3, 4], [6, 5], 2
    q, qv = torch.randn(sum(lq), H, 32), torch.randn(sum(lq), H, 48)
    k, v = torch.randn(sum(lk), 1, 32), torch.randn(sum(lk), 1, 48)
    out = fa3.flash_attn_varlen_func(q, k, v, cu(lq), cu(lk), max(lq), max(lk), causal=True, qv=qv)
    for b in range(2):
        qs, ks = slice(sum(lq[:b]), sum(lq[:b + 1])), slice(sum(lk[:b]), sum(lk[:b + 1]))
        args = (q[qs][None], qv[qs][None], k[ks][None], v[ks][None], 80 ** -0.5)
        ref, same = qv_ref(*args, causal=True), qv_ref(*args, causal=True, compute_dtype=F32)
        assert_close_to_ref(out[qs][None], ref, same, name=f"out sequence {b}")


def test_qv_kvcache_compiles_fullgraph():
    """The qv decode step (append, then attend) under torch.compile(fullgraph=True) equals eager."""
    torch._dynamo.reset()
    buf_eager, lens = torch.randn(2, 8, 1, 576), torch.tensor([2, 5], dtype=torch.int32)
    buf_compiled = buf_eager.clone()
    q, qv, k_new, v_new = torch.randn(2, 1, 4, 64), torch.randn(2, 1, 4, 512), torch.randn(2, 1, 1, 64), \
        torch.randn(2, 1, 1, 512)

    def step(buf):
        return fa3.flash_attn_with_kvcache(q, buf[..., 512:], buf[..., :512], k_new, v_new, qv=qv,
                                           cache_seqlens=lens)
    expected = step(buf_eager)
    got = torch.compile(step, fullgraph=True)(buf_compiled)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(buf_compiled, buf_eager)


# --------------------------------------------------------------------------------------------------
# Attention sinks (s_aux / learnable_sink) and attention_chunk through both modules
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sink_name", ["s_aux", "learnable_sink"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sinks_and_chunk_through_flash_attn_func(sink_name, dtype):
    q, k, v = (torch.randn(2, 40, h, 32, dtype=dtype) for h in (8, 2, 2))
    sinks = torch.randn(8)
    ref = attention_ref(q, k, v, causal=True, sinks=sinks, attention_chunk=16)
    same = same_dtype_ref(attention_ref, q, k, v, causal=True, sinks=sinks, attention_chunk=16, compute_dtype=dtype)
    out = fa3.flash_attn_func(q, k, v, causal=True, attention_chunk=16, **{sink_name: sinks})
    assert_close_to_ref(out, ref[0], same[0], name="fa3 out")
    ref = attention_ref(q, k, v, causal=True, sinks=sinks)
    same = same_dtype_ref(attention_ref, q, k, v, causal=True, sinks=sinks, compute_dtype=dtype)
    assert_close_to_ref(fa2.flash_attn_func(q, k, v, causal=True, **{sink_name: sinks}), ref[0], same[0],
                        name="fa2 out")


def test_sinks_and_chunk_through_varlen_and_kvcache():
    lens = [5, 0, 33]
    q, k, v = (torch.randn(sum(lens), h, 16, dtype=torch.float64) for h in (4, 2, 2))
    sinks = torch.randn(4, dtype=torch.float64)
    c = cu(lens)
    ref_out, ref_lse = attention_ref(q, k, v, cu_seqlens_q=c, cu_seqlens_k=c, causal=True, sinks=sinks,
                                     attention_chunk=8)
    for module, kw in ((fa3, dict(attention_chunk=8, learnable_sink=sinks)), (fa2, dict(s_aux=sinks))):
        out, lse = module.flash_attn_varlen_func(q, k, v, c, c, 33, 33, causal=True, return_attn_probs=True,
                                                 **kw)[:2]
        expected = ref_out if module is fa3 else attention_ref(q, k, v, cu_seqlens_q=c, cu_seqlens_k=c, causal=True,
                                                               sinks=sinks)[0]
        torch.testing.assert_close(out, expected)
    # decode over a cache: the new token appended, then attention with the sink
    kc, vc = torch.zeros(2, 32, 2, 16, dtype=torch.float64), torch.zeros(2, 32, 2, 16, dtype=torch.float64)
    keys, values = torch.randn(2, 20, 2, 16, dtype=torch.float64), torch.randn(2, 20, 2, 16, dtype=torch.float64)
    kc[:, :20], vc[:, :20] = keys, values
    qd = torch.randn(2, 1, 4, 16, dtype=torch.float64)
    out = fa3.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=20, causal=True, attention_chunk=8,
                                      learnable_sink=sinks)
    torch.testing.assert_close(out, attention_ref(qd, keys, values, causal=True, sinks=sinks, attention_chunk=8)[0])
    out = fa2.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=20, causal=True, s_aux=sinks)
    torch.testing.assert_close(out, attention_ref(qd, keys, values, causal=True, sinks=sinks)[0])


def test_both_sink_names_are_refused():
    q = torch.randn(1, 4, 2, 16)
    with pytest.raises(ValueError, match="give the attention sinks as s_aux or as learnable_sink, not both"):
        fa3.flash_attn_func(q, q, q, s_aux=torch.zeros(2), learnable_sink=torch.zeros(2))
