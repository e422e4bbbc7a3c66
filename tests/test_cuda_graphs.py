"""CUDA-graph tests: the ops captured with torch.cuda.graph and replayed on NEW inputs copied into
the static tensors (new values, new cache lengths / slots), compared after every replay with the
same ops run eagerly on the same inputs and with the float64 reference (tolerance rule of
tests/reference.py). Skipped without a GPU.

- attention forward + backward (torch.autograd.grad inside the capture);
- a GQA decode step: rotary_embedding_ on q and k in place, kv_cache_append (contiguous) or
  paged_kv_cache_append (block 16 and 1), attention_with_kvcache, driven by static cache_seqlens /
  slot_mapping tensors that change between replays (a row also jumps to another length, as when a
  new sequence takes its slot);
- an MLA decode step: rotary_embedding_ on q_rope and k_pe (interleaved), mla_cache_append
  (contiguous or paged, block 64), mla_decode.

Under capture the ops skip their value checks (reading device values would need a host copy), so
these tests also prove that nothing in the ops synchronizes or reads values on the host.
"""

import pytest
import torch

import attn_ops
from kvcache_reference import attention_with_kvcache_ref, shuffled_block_table
from mla_reference import mla_decode_ref
from reference import assert_close_to_ref, attention_ref, same_dtype_ref
from rope_reference import rope_ref

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")

DEV = "cuda"
BF16 = torch.bfloat16


def capture(step, warmup=2):
    """Warms step() up on a side stream, then captures it. Returns (graph, step's outputs)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    return graph, outs


def assert_same_as_eager(graph_t, eager_t, name):
    """Replayed and eager results of the same kernels on the same inputs."""
    torch.testing.assert_close(graph_t, eager_t, msg=lambda m: f"{name}: replay != eager: {m}")


# --------------------------------------------------------------------------------------------------
# attention forward + backward
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [dict(causal=True), dict(window_left=24, softcap=6.0)],
                         ids=["causal", "window_softcap"])
@pytest.mark.parametrize("dims", [(128, 128), (192, 128)], ids=["d128", "d192_128"])
def test_graph_attention_forward_backward(dims, kw):
    dqk, dv = dims
    B, T, Hq, Hkv = 2, 100, 8, 2
    q = torch.randn(B, T, Hq, dqk, dtype=BF16, device=DEV, requires_grad=True)
    k = torch.randn(B, T, Hkv, dqk, dtype=BF16, device=DEV, requires_grad=True)
    v = torch.randn(B, T, Hkv, dv, dtype=BF16, device=DEV, requires_grad=True)
    g_out = torch.randn(B, T, Hq, dv, dtype=BF16, device=DEV)

    def step():
        out, lse = attn_ops.attention(q, k, v, **kw)
        dq, dk, dv_ = torch.autograd.grad(out, (q, k, v), g_out)
        return out, lse, dq, dk, dv_

    graph, static = capture(step)
    for _ in range(3):
        with torch.no_grad():
            for t in (q, k, v, g_out):
                t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        eager = step()
        for name, a, e in zip(("out", "lse", "dq", "dk", "dv"), static, eager):
            assert_same_as_eager(a, e, name)
        # against the float64 reference (and its same-dtype twin for the error budget)
        refs = []
        for cdt in (torch.float64, torch.float32):  # ref64, then the rule's baseline (float32, rounded once below)
            leaves = [t.detach().to(cdt).requires_grad_() for t in (q, k, v)]
            r_out, r_lse = attention_ref(*leaves, **kw, compute_dtype=cdt)
            grads = torch.autograd.grad(r_out, leaves, g_out.to(cdt))
            refs.append((r_out, r_lse) + tuple(grads))
        base_out = same_dtype_ref(attention_ref, q, k, v, **kw, compute_dtype=BF16)[0]
        refs[1] = (base_out, refs[1][1]) + tuple(g.to(BF16) for g in refs[1][2:])
        for name, a, r64, same in zip(("out", "lse", "dq", "dk", "dv"), static, *refs):
            assert_close_to_ref(a, r64, same, name=f"replayed {name}", rounded_intermediates=name.startswith("d"))


# --------------------------------------------------------------------------------------------------
# GQA decode step
# --------------------------------------------------------------------------------------------------
def decode_lengths(B, capacity, steps):
    """Per step, the lengths before the step: rows advance by one token each step; at step 2 row 0
    restarts at length 3 (another sequence takes the slot)."""
    lens = torch.randint(5, capacity - steps - 1, (B,))
    out = []
    for s in range(steps):
        if s == 2:
            lens[0] = 3
        out.append(lens.clone())
        lens = lens + 1
    return out


@pytest.mark.parametrize("block_size", [None, 16, 1], ids=["contiguous", "paged16", "paged1"])
def test_graph_gqa_decode_step(block_size):
    B, Hq, Hkv, D, capacity, steps = 3, 8, 2, 128, 64, 4
    cos, sin = attn_ops.rotary_cos_sin(capacity, D, dtype=torch.float32, device=DEV)
    paged = block_size is not None
    if paged:
        mb = capacity // block_size
        bt = shuffled_block_table(B, mb, B * mb + 2, DEV)
        k_cache = torch.randn(B * mb + 2, block_size, Hkv, D, dtype=BF16, device=DEV)
    else:
        bt = None
        k_cache = torch.randn(B, capacity, Hkv, D, dtype=BF16, device=DEV)
    v_cache = torch.randn_like(k_cache)
    # static inputs
    q = torch.randn(B, 1, Hq, D, dtype=BF16, device=DEV)
    k = torch.randn(B, 1, Hkv, D, dtype=BF16, device=DEV)
    v = torch.randn_like(k)
    lens = torch.zeros(B, dtype=torch.int32, device=DEV)          # lengths before the step
    slots = torch.zeros(B, dtype=torch.int64, device=DEV)         # paged: where each new token goes

    def step(q=q, k=k, v=v, lens=lens, slots=slots, k_cache=k_cache, v_cache=v_cache):
        pos = lens.view(B, 1)
        attn_ops.rotary_embedding_(q, cos, sin, pos)
        attn_ops.rotary_embedding_(k, cos, sin, pos)
        if paged:
            attn_ops.paged_kv_cache_append(k_cache, v_cache, k.view(B, Hkv, D), v.view(B, Hkv, D),
                                           slots)
        else:
            attn_ops.kv_cache_append(k_cache, v_cache, k, v, lens)
        return attn_ops.attention_with_kvcache(q, k_cache, v_cache, lens + 1, block_table=bt)

    start = (k_cache.clone(), v_cache.clone())
    lens.fill_(5)
    if paged:
        slots.copy_(bt[:, 5 // block_size].long() * block_size + 5 % block_size)
    graph, (out, lse) = capture(step)
    k_cache.copy_(start[0])
    v_cache.copy_(start[1])
    eager_k, eager_v = start[0].clone(), start[1].clone()

    for L in decode_lengths(B, capacity, steps):
        new = [torch.randn_like(t) for t in (q, k, v)]
        L = L.to(DEV, torch.int32)
        s = (bt.long().gather(1, (L.long() // block_size).view(B, 1)).view(B) * block_size
             + L.long() % block_size) if paged else torch.zeros_like(slots)
        for t, n in zip((q, k, v), new):
            t.copy_(n)
        lens.copy_(L)
        slots.copy_(s)
        graph.replay()
        torch.cuda.synchronize()
        eq, ek, ev = (n.clone() for n in new)
        e_out, e_lse = step(eq, ek, ev, L, s, eager_k, eager_v)
        assert torch.equal(q, eq) and torch.equal(k, ek), "rotary: replay != eager"
        assert torch.equal(k_cache, eager_k) and torch.equal(v_cache, eager_v), \
            "cache append: replay != eager"
        assert_same_as_eager(out, e_out, "out")
        assert_same_as_eager(lse, e_lse, "lse")
        r = [attention_with_kvcache_ref(eq, k_cache, v_cache, L + 1, block_table=bt),
             same_dtype_ref(attention_with_kvcache_ref, eq, k_cache, v_cache, L + 1, block_table=bt,
                            compute_dtype=BF16)]
        assert_close_to_ref(out, r[0][0], r[1][0], name="replayed out")
        assert_close_to_ref(lse, r[0][1], r[1][1], name="replayed lse")
        # the rotated q is rope(new q) at the row's position
        r64, same = (rope_ref(new[0], cos, sin, L.view(B, 1), compute_dtype=c)
                     for c in (torch.float64, torch.float32))
        same = same.to(BF16)  # the rule's baseline: float32, rounded once
        assert_close_to_ref(q, r64, same, name="rotated q")


def test_graph_append_that_does_not_fit_writes_nothing_of_its_row():
    """Under capture the value checks do not run (docs/cuda.md): an append whose row has no room for all its
    tokens must leave that row as it was, not write the tokens that fit; the other rows are appended."""
    k_cache = torch.randn(2, 16, 2, 8, dtype=BF16, device=DEV)
    v_cache = torch.randn_like(k_cache)
    k, v = torch.randn(2, 3, 2, 8, dtype=BF16, device=DEV), torch.randn(2, 3, 2, 8, dtype=BF16, device=DEV)
    lens = torch.tensor([2, 5], dtype=torch.int32, device=DEV)
    graph, _ = capture(lambda: attn_ops.kv_cache_append(k_cache, v_cache, k, v, lens))
    before = (k_cache.clone(), v_cache.clone())
    lens.copy_(torch.tensor([2, 14], dtype=torch.int32))  # row 1: 14 + 3 > 16
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(k_cache[1], before[0][1]) and torch.equal(v_cache[1], before[1][1])
    assert torch.equal(k_cache[0, 2:5], k[0]) and torch.equal(v_cache[0, 2:5], v[0])


def test_graph_lightning_varlen_with_bad_offsets_stays_in_bounds():
    """Packed lightning attention replayed with cu_seqlens past the packed tokens: the kernel clamps the offsets
    to the rows it was given (no illegal access, which would end the CUDA context); a later eager call works."""
    N, H, D = 12, 2, 8
    q, k, v = (torch.randn(N, H, D, device=DEV) for _ in range(3))
    s = torch.full((H,), 0.1, device=DEV)
    cu = torch.tensor([0, 5, N], dtype=torch.int32, device=DEV)
    graph, (out, _) = capture(lambda: attn_ops.lightning_attention(q, k, v, s, cu_seqlens=cu, max_seqlen=N))
    cu.copy_(torch.tensor([0, 5, 1 << 20], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    cu.copy_(torch.tensor([0, 5, N], dtype=torch.int32))
    graph.replay()
    eager, _ = attn_ops.lightning_attention(q, k, v, s, cu_seqlens=cu, max_seqlen=N)
    assert_same_as_eager(out, eager, "out")


# --------------------------------------------------------------------------------------------------
# MLA decode step
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("block_size", [None, 64], ids=["contiguous", "paged64"])
def test_graph_mla_decode_step(block_size):
    B, H, d_c, d_r, capacity, steps = 3, 16, 512, 64, 128, 4
    scale = 192 ** -0.5
    cos, sin = attn_ops.rotary_cos_sin(capacity, d_r, dtype=torch.float32, device=DEV)
    paged = block_size is not None
    if paged:
        mb = capacity // block_size
        bt = shuffled_block_table(B, mb, B * mb + 2, DEV)
        cache = torch.randn(B * mb + 2, block_size, d_c + d_r, dtype=BF16, device=DEV)
    else:
        bt = None
        cache = torch.randn(B, capacity, d_c + d_r, dtype=BF16, device=DEV)
    q_latent = torch.randn(B, 1, H, d_c, dtype=BF16, device=DEV)
    q_rope = torch.randn(B, 1, H, d_r, dtype=BF16, device=DEV)
    c_kv = torch.randn(B, 1, d_c, dtype=BF16, device=DEV)
    k_pe = torch.randn(B, 1, d_r, dtype=BF16, device=DEV)
    lens = torch.zeros(B, dtype=torch.int32, device=DEV)
    slots = torch.zeros(B, dtype=torch.int32, device=DEV)

    def step(q_latent=q_latent, q_rope=q_rope, c_kv=c_kv, k_pe=k_pe, lens=lens, slots=slots,
             cache=cache):
        pos = lens.view(B, 1)
        attn_ops.rotary_embedding_(q_rope, cos, sin, pos, interleaved=True)
        attn_ops.rotary_embedding_(k_pe.unsqueeze(2), cos, sin, pos, interleaved=True)
        if paged:
            attn_ops.mla_cache_append(cache, c_kv.view(B, d_c), k_pe.view(B, d_r), slot_mapping=slots)
        else:
            attn_ops.mla_cache_append(cache, c_kv, k_pe, cache_seqlens=lens)
        return attn_ops.mla_decode(q_latent, q_rope, cache, lens + 1, scale=scale, block_table=bt)

    start = cache.clone()
    lens.fill_(5)
    if paged:
        slots.copy_((bt[:, 0].long() * block_size + 5).to(torch.int32))
    graph, (out, lse) = capture(step)
    cache.copy_(start)
    eager_cache = start.clone()

    for L in decode_lengths(B, capacity, steps):
        new = [torch.randn_like(t) for t in (q_latent, q_rope, c_kv, k_pe)]
        L = L.to(DEV, torch.int32)
        s = ((bt.long().gather(1, (L.long() // block_size).view(B, 1)).view(B) * block_size
              + L.long() % block_size).to(torch.int32) if paged else torch.zeros_like(slots))
        for t, n in zip((q_latent, q_rope, c_kv, k_pe), new):
            t.copy_(n)
        lens.copy_(L)
        slots.copy_(s)
        graph.replay()
        torch.cuda.synchronize()
        e = [n.clone() for n in new]
        e_out, e_lse = step(*e, L, s, eager_cache)
        assert torch.equal(q_rope, e[1]) and torch.equal(k_pe, e[3]), "rotary: replay != eager"
        assert torch.equal(cache, eager_cache), "latent append: replay != eager"
        assert_same_as_eager(out, e_out, "out_latent")
        assert_same_as_eager(lse, e_lse, "lse")
        r = [mla_decode_ref(q_latent, q_rope, cache, L + 1, scale=scale, block_table=bt),
             same_dtype_ref(mla_decode_ref, q_latent, q_rope, cache, L + 1, scale=scale, block_table=bt,
                            compute_dtype=BF16)]
        assert_close_to_ref(out, r[0][0], r[1][0], name="replayed out_latent")
        assert_close_to_ref(lse, r[0][1], r[1][1], name="replayed lse")
