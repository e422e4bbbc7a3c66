"""torch.library.opcheck on mla_cache_append (mutating) and mla_decode, and an MLA decode step
(mla_cache_append, then mla_decode) under torch.compile(fullgraph=True): no graph break, the eager
result, the latent cache written in place, and no copy of the cache in Inductor's code (the
detector of tests/test_kvcache_compile.py).
"""

import pytest
import torch
from torch.library import opcheck

import attn_ops
from kvcache_reference import shuffled_block_table, slots_for
from mla_reference import mla_inputs
from test_kvcache_compile import _cache_copy_lines


# --------------------------------------------------------------------------------------------------
# opcheck
# --------------------------------------------------------------------------------------------------
def append_inputs(name, device):
    """(args, kwargs) of mla_cache_append."""
    if name == "contig_f32_tnew3":
        return ((torch.randn(3, 16, 48, device=device), torch.randn(3, 3, 32, device=device),
                 torch.randn(3, 3, 16, device=device)),
                dict(cache_seqlens=torch.tensor([0, 5, 13], dtype=torch.int32, device=device)))
    if name == "contig_bf16_tnew1_split_views":
        kv = torch.randn(2, 1, 576, dtype=torch.bfloat16, device=device)
        cache = torch.randn(2, 9, 580, dtype=torch.bfloat16, device=device)[..., :576]
        return ((cache, kv[..., :512], kv[..., 512:]),
                dict(cache_seqlens=torch.tensor([8, 0], dtype=torch.int32, device=device)))
    if name == "contig_f64_tnew0":
        return ((torch.randn(2, 4, 24, dtype=torch.float64, device=device),
                 torch.randn(2, 0, 16, dtype=torch.float64, device=device),
                 torch.randn(2, 0, 8, dtype=torch.float64, device=device)),
                dict(cache_seqlens=torch.tensor([4, 1], dtype=torch.int32, device=device)))
    bs, dtype, sdt = {"paged_f32_bs16_int32": (16, torch.float32, torch.int32),
                      "paged_f16_bs1_int64": (1, torch.float16, torch.int64),
                      "paged_f32_bs64_int64": (64, torch.float32, torch.int64)}[name]
    nb = 5
    slots = torch.randperm(nb * bs)[:4].tolist() + [-1]
    return ((torch.randn(nb, bs, 48, dtype=dtype, device=device),
             torch.randn(5, 32, dtype=dtype, device=device),
             torch.randn(5, 16, dtype=dtype, device=device)),
            dict(slot_mapping=torch.tensor(slots, dtype=sdt, device=device)))


APPEND_CASES = ["contig_f32_tnew3", "contig_bf16_tnew1_split_views", "contig_f64_tnew0",
                "paged_f32_bs16_int32", "paged_f16_bs1_int64", "paged_f32_bs64_int64"]


@pytest.mark.parametrize("case", APPEND_CASES)
def test_opcheck_mla_cache_append(case, device):
    args, kw = append_inputs(case, device)
    opcheck(torch.ops.attn_ops.mla_cache_append.default, args, kw)


# name: (B, Tq, H, d_c, d_rope, lens, block_size, dtype, kwargs)
DECODE_OPCHECK = {
    "decode_contig_f32": (3, 1, 16, 32, 16, [5, 0, 9], None, torch.float32, {}),
    "tq2_paged16_bf16": (2, 2, 16, 32, 16, [20, 3], 16, torch.bfloat16, {}),
    "tq2_paged1_f64_full": (2, 2, 4, 32, 16, [0, 7], 1, torch.float64, dict(causal=False)),
    "dc512_h16_contig_f32": (2, 1, 16, 512, 64, [12, 1], None, torch.float32, {}),
}


@pytest.mark.parametrize("case", list(DECODE_OPCHECK))
def test_opcheck_mla_decode(case, device):
    B, Tq, H, d_c, d_rope, lens, bs, dtype, kw = DECODE_OPCHECK[case]
    ql, qr, cache, sl, bt, _ = mla_inputs(B, Tq, H, d_c, d_rope, lens, dtype=dtype,
                                          device=device, block_size=bs)
    opcheck(torch.ops.attn_ops.mla_decode.default, (ql, qr, cache, sl),
            dict(scale=0.125, block_table=bt, **kw))


# --------------------------------------------------------------------------------------------------
# Decode step under torch.compile
# --------------------------------------------------------------------------------------------------
# Distinctive shapes, so that a copy of the cache is recognisable in the generated code.
B, H, D_C, D_ROPE, CAP, BS, NUM_BLOCKS = 2, 4, 40, 8, 37, 16, 11
SCALE = 0.15


def mla_decode_step(q_latent, q_rope, kv_new, latent_cache, cache_seqlens):
    """Split the step's [c_kv ; k_pe] projection, append it at each row's length, attend with the
    advanced lengths."""
    c_kv, k_pe = kv_new.split([D_C, D_ROPE], dim=-1)
    attn_ops.mla_cache_append(latent_cache, c_kv, k_pe, cache_seqlens=cache_seqlens)
    out, lse = attn_ops.mla_decode(q_latent, q_rope, latent_cache,
                                   cache_seqlens + q_latent.shape[1], scale=SCALE)
    return out * 2.0, lse


def paged_mla_decode_step(q_latent, q_rope, kv_new, latent_cache, slot_mapping, block_table,
                          seqlens_after):
    c_kv, k_pe = kv_new.flatten(0, 1).split([D_C, D_ROPE], dim=-1)
    attn_ops.mla_cache_append(latent_cache, c_kv, k_pe, slot_mapping=slot_mapping)
    out, lse = attn_ops.mla_decode(q_latent, q_rope, latent_cache, seqlens_after, scale=SCALE,
                                   block_table=block_table)
    return out * 2.0, lse


class DecodeProblem:
    """A latent cache and decode steps (Tq tokens each) for both cache kinds."""

    def __init__(self, kind, device, tq=1, start=(5, 17)):
        self.kind, self.device, self.tq = kind, device, tq
        if kind == "contig":
            self.cache = torch.randn(B, CAP, D_C + D_ROPE, device=device)
            self.block_table = None
        else:
            self.cache = torch.randn(NUM_BLOCKS, BS, D_C + D_ROPE, device=device)
            self.block_table = shuffled_block_table(B, 3, NUM_BLOCKS, device)
        self.seqlens = torch.tensor(start, dtype=torch.int32, device=device)

    def clone_state(self):
        return self.cache.clone(), self.seqlens.clone()

    def step_inputs(self, tq=None):
        tq = self.tq if tq is None else tq
        return (torch.randn(B, tq, H, D_C, device=self.device),
                torch.randn(B, tq, H, D_ROPE, device=self.device),
                torch.randn(B, tq, D_C + D_ROPE, device=self.device))

    def args(self, ql, qr, kv, cache, seqlens):
        if self.kind == "contig":
            return (ql, qr, kv, cache, seqlens)
        tq = ql.shape[1]
        pairs = [(b, int(seqlens[b]) + t) for b in range(B) for t in range(tq)]
        slots = torch.tensor(slots_for(self.block_table, BS, pairs), dtype=torch.int64,
                             device=self.device)
        return (ql, qr, kv, cache, slots, self.block_table, seqlens + tq)

    @property
    def fn(self):
        return mla_decode_step if self.kind == "contig" else paged_mla_decode_step


@pytest.mark.parametrize("kind", ["contig", "paged"])
def test_decode_step_explain_no_graph_break(kind, device):
    p = DecodeProblem(kind, device)
    cache, sl = p.clone_state()
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(p.fn)(*p.args(*p.step_inputs(), cache, sl))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def _not_in_place_step(q_latent, q_rope, kv_new, latent_cache, cache_seqlens):
    # the old cache contents are needed after the append: Inductor must keep a copy
    old = latent_cache[:, :3].sum()
    out, lse = mla_decode_step(q_latent, q_rope, kv_new, latent_cache, cache_seqlens)
    return out + old, lse


def test_copy_detector_catches_a_clone(device):
    from torch._inductor.utils import run_and_get_code

    p = DecodeProblem("contig", device)
    cache, sl = p.clone_state()
    torch._dynamo.reset()
    _, codes = run_and_get_code(torch.compile(_not_in_place_step, fullgraph=True),
                                *p.args(*p.step_inputs(), cache, sl))
    assert _cache_copy_lines(codes, cache.numel()), "the copy detector missed a cache copy"


@pytest.mark.parametrize("kind", ["contig", "paged"])
def test_decode_step_compiled_matches_eager_in_place(kind, device):
    from torch._inductor.utils import run_and_get_code

    p = DecodeProblem(kind, device)
    e_cache, e_sl = p.clone_state()     # eager state
    c_cache, c_sl = p.clone_state()     # compiled state
    ptr = c_cache.data_ptr()
    torch._dynamo.reset()
    compiled = torch.compile(p.fn, fullgraph=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for step in range(3):
            ql, qr, kv = p.step_inputs()
            eo, el = p.fn(*p.args(ql, qr, kv, e_cache, e_sl))
            if step == 0:
                (co, cl), codes = run_and_get_code(compiled, *p.args(ql, qr, kv, c_cache, c_sl))
                bad = _cache_copy_lines(codes, c_cache.numel())
                assert not bad, ("the compiled decode step copies the latent cache instead of "
                                 "writing it in place:\n" + "\n".join(bad))
            else:
                co, cl = compiled(*p.args(ql, qr, kv, c_cache, c_sl))
            # the compiled graph wrote the cache given to it, in place, as eager did
            assert c_cache.data_ptr() == ptr
            assert torch.equal(c_cache, e_cache)
            assert not torch.equal(c_cache, p.cache)
            torch.testing.assert_close(co, eo, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(cl, el, rtol=1e-6, atol=1e-6)
            e_sl += p.tq
            c_sl += p.tq


def test_chunked_prefill_compiled_dynamic_no_recompile(device):
    """Chunks of different lengths (Tq) through one dynamic-shape graph (no recompile)."""
    p = DecodeProblem("contig", device, start=(0, 3))
    e_cache, e_sl = p.clone_state()
    c_cache, c_sl = p.clone_state()
    torch._dynamo.reset()
    compiled = torch.compile(mla_decode_step, fullgraph=True, dynamic=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for tq in (3, 7, 5):   # none equal to another size (duck sizing would specialize)
            ql, qr, kv = p.step_inputs(tq)
            eo, el = mla_decode_step(ql, qr, kv, e_cache, e_sl)
            co, cl = compiled(ql, qr, kv, c_cache, c_sl)
            assert torch.equal(c_cache, e_cache)
            torch.testing.assert_close(co, eo, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(cl, el, rtol=1e-6, atol=1e-6)
            e_sl += tq
            c_sl += tq
