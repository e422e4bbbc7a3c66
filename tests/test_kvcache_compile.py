"""torch.library.opcheck on the three KV-cache ops (the two mutating appends included), and a decode
step (append, then attend) under torch.compile(fullgraph=True): no graph break, the eager result,
the caches written in place, and no full copy of a cache in the compiled code.
"""

import re

import pytest
import torch
from torch.library import opcheck

import attn_ops
from kvcache_reference import cache_pair, kvcache_inputs, shuffled_block_table, slots_for


# --------------------------------------------------------------------------------------------------
# opcheck
# --------------------------------------------------------------------------------------------------
def append_inputs(name, device):
    if name == "f32_tnew3":
        kc, vc, _ = cache_pair(torch.randn(3, 16, 2, 16, device=device),
                               torch.randn(3, 16, 2, 8, device=device))
        return (kc, vc, torch.randn(3, 3, 2, 16, device=device),
                torch.randn(3, 3, 2, 8, device=device),
                torch.tensor([0, 5, 13], dtype=torch.int32, device=device))
    if name == "bf16_tnew1_views":
        kc, vc, _ = cache_pair(torch.randn(2, 9, 4, 32, dtype=torch.bfloat16, device=device),
                               torch.randn(2, 9, 4, 32, dtype=torch.bfloat16, device=device),
                               "transposed")
        k = torch.randn(2, 4, 1, 32, dtype=torch.bfloat16, device=device).transpose(1, 2)
        return (kc, vc, k, torch.randn(2, 1, 4, 32, dtype=torch.bfloat16, device=device),
                torch.tensor([8, 0], dtype=torch.int32, device=device))
    if name == "f64_tnew0":
        return (torch.randn(2, 4, 1, 8, dtype=torch.float64, device=device),
                torch.randn(2, 4, 1, 8, dtype=torch.float64, device=device),
                torch.randn(2, 0, 1, 8, dtype=torch.float64, device=device),
                torch.randn(2, 0, 1, 8, dtype=torch.float64, device=device),
                torch.tensor([4, 1], dtype=torch.int32, device=device))
    raise ValueError(name)


@pytest.mark.parametrize("case", ["f32_tnew3", "bf16_tnew1_views", "f64_tnew0"])
def test_opcheck_kv_cache_append(case, device):
    opcheck(torch.ops.attn_ops.kv_cache_append.default, append_inputs(case, device))


def paged_append_inputs(name, device):
    bs, dtype, sdt = {"f32_bs16_int32": (16, torch.float32, torch.int32),
                      "f16_bs1_int64": (1, torch.float16, torch.int64),
                      "f32_bs64_int64_sliced": (64, torch.float32, torch.int64)}[name]
    nb = 5
    kc, vc, _ = cache_pair(torch.randn(nb, bs, 2, 16, dtype=dtype, device=device),
                           torch.randn(nb, bs, 2, 16, dtype=dtype, device=device),
                           "sliced" if "sliced" in name else "contiguous")
    slots = torch.randperm(nb * bs)[:4].tolist() + [-1]
    return (kc, vc, torch.randn(5, 2, 16, dtype=dtype, device=device),
            torch.randn(5, 2, 16, dtype=dtype, device=device),
            torch.tensor(slots, dtype=sdt, device=device))


@pytest.mark.parametrize("case", ["f32_bs16_int32", "f16_bs1_int64", "f32_bs64_int64_sliced"])
def test_opcheck_paged_kv_cache_append(case, device):
    opcheck(torch.ops.attn_ops.paged_kv_cache_append.default, paged_append_inputs(case, device))


# name: (B, Tq, Hq, Hkv, Dk, Dv, lens, block_size, dtype, kwargs)
ATTN_OPCHECK = {
    "decode_contig_f32": (3, 1, 8, 2, 16, 16, [5, 0, 9], None, torch.float32, {}),
    "tq4_paged16_window_bf16": (2, 4, 4, 1, 32, 32, [20, 3], 16, torch.bfloat16,
                                dict(window_left=5)),
    "softcap_scale_paged1_f64": (2, 2, 4, 2, 8, 4, [0, 7], 1, torch.float64,
                                 dict(softcap=2.0, scale=0.5, causal=False)),
    "tq3_contig_full_window_f32": (2, 3, 2, 2, 16, 8, [11, 2], None, torch.float32,
                                   dict(causal=False, window_left=2, window_right=1)),
}


@pytest.mark.parametrize("case", list(ATTN_OPCHECK))
def test_opcheck_attention_with_kvcache(case, device):
    B, Tq, Hq, Hkv, Dk, Dv, lens, bs, dtype, kw = ATTN_OPCHECK[case]
    q, kc, vc, sl, bt = kvcache_inputs(B, Tq, Hq, Hkv, Dk, Dv, lens, dtype=dtype, device=device,
                                       block_size=bs)
    opcheck(torch.ops.attn_ops.attention_with_kvcache.default, (q, kc, vc, sl),
            dict(block_table=bt, **kw))


# --------------------------------------------------------------------------------------------------
# Decode step under torch.compile
# --------------------------------------------------------------------------------------------------
def decode_step(q, k_new, v_new, k_cache, v_cache, cache_seqlens):
    """Append the step's tokens at each row's length, then attend with the advanced lengths."""
    attn_ops.kv_cache_append(k_cache, v_cache, k_new, v_new, cache_seqlens)
    out, lse = attn_ops.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens + q.shape[1],
                                               causal=True)
    return out * 2.0, lse


def paged_decode_step(q, k_new, v_new, k_cache, v_cache, slot_mapping, block_table, seqlens_after):
    attn_ops.paged_kv_cache_append(k_cache, v_cache, k_new.flatten(0, 1), v_new.flatten(0, 1),
                                   slot_mapping)
    out, lse = attn_ops.attention_with_kvcache(q, k_cache, v_cache, seqlens_after,
                                               block_table=block_table, softcap=20.0)
    return out * 2.0, lse


# Distinctive cache shapes, so that a copy of a cache is recognisable in the generated code.
B, HQ, HKV, D, CAP, BS = 2, 4, 2, 24, 37, 16
NUM_BLOCKS = 11


class DecodeProblem:
    """Caches and a sequence of decode steps (Tq tokens each) for both cache kinds."""

    def __init__(self, kind, device, tq=1, start=(5, 17)):
        self.kind, self.device, self.tq = kind, device, tq
        if kind == "contig":
            self.k_cache = torch.randn(B, CAP, HKV, D, device=device)
            self.v_cache = torch.randn(B, CAP, HKV, D, device=device)
            self.block_table = None
        else:
            self.k_cache = torch.randn(NUM_BLOCKS, BS, HKV, D, device=device)
            self.v_cache = torch.randn(NUM_BLOCKS, BS, HKV, D, device=device)
            self.block_table = shuffled_block_table(B, 3, NUM_BLOCKS, device)
        self.seqlens = torch.tensor(start, dtype=torch.int32, device=device)

    def clone_state(self):
        return self.k_cache.clone(), self.v_cache.clone(), self.seqlens.clone()

    def step_inputs(self, seqlens, tq=None):
        tq = self.tq if tq is None else tq
        q = torch.randn(B, tq, HQ, D, device=self.device)
        k = torch.randn(B, tq, HKV, D, device=self.device)
        v = torch.randn(B, tq, HKV, D, device=self.device)
        return q, k, v

    def args(self, q, k, v, kc, vc, seqlens):
        if self.kind == "contig":
            return (q, k, v, kc, vc, seqlens)
        tq = q.shape[1]
        pairs = [(b, int(seqlens[b]) + t) for b in range(B) for t in range(tq)]
        slots = torch.tensor(slots_for(self.block_table, BS, pairs), dtype=torch.int64,
                             device=self.device)
        return (q, k, v, kc, vc, slots, self.block_table, seqlens + tq)

    @property
    def fn(self):
        return decode_step if self.kind == "contig" else paged_decode_step


@pytest.mark.parametrize("kind", ["contig", "paged"])
def test_decode_step_explain_no_graph_break(kind, device):
    p = DecodeProblem(kind, device)
    kc, vc, sl = p.clone_state()
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(p.fn)(*p.args(*p.step_inputs(sl), kc, vc, sl))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def _cache_copy_lines(codes, cache_numel):
    """Lines of Inductor's generated code that show a copy of a cache: a buffer allocation of at
    least a cache's number of elements (Inductor allocates a clone flat: empty_strided_cpu((3552, ),
    ...)), or a generated kernel whose name says clone / copy (the clone, and the copy back into the
    graph input that functionalization emits when the op's write is not re-inplaced).
    Checked against a deliberately non-reinplaceable function in test_copy_detector_catches_a_clone.
    """
    alloc = re.compile(r"empty_strided\w*\(\(([\d,\s]*)\)")
    kernel = re.compile(r"\b\w*_fused\w*(?:clone|copy)\w*\(")
    bad = []
    for code in codes:
        for line in code.splitlines():
            for m in alloc.finditer(line):
                numel = 1
                for d in (x for x in m.group(1).split(",") if x.strip()):
                    numel *= int(d)
                if numel >= cache_numel:
                    bad.append(line.strip())
            if kernel.search(line) and "async_compile" not in line:
                bad.append(line.strip())
    return bad


def _not_in_place_step(q, k_new, v_new, k_cache, v_cache, cache_seqlens):
    # the old cache contents are needed after the append: Inductor must keep a copy
    old = k_cache[:, :3].sum()
    out, lse = decode_step(q, k_new, v_new, k_cache, v_cache, cache_seqlens)
    return out + old, lse


def test_copy_detector_catches_a_clone(device):
    from torch._inductor.utils import run_and_get_code

    p = DecodeProblem("contig", device)
    kc, vc, sl = p.clone_state()
    torch._dynamo.reset()
    _, codes = run_and_get_code(torch.compile(_not_in_place_step, fullgraph=True),
                                *p.args(*p.step_inputs(sl), kc, vc, sl))
    assert _cache_copy_lines(codes, kc.numel()), "the copy detector missed a cache copy"


@pytest.mark.parametrize("kind", ["contig", "paged"])
def test_decode_step_compiled_matches_eager_in_place(kind, device):
    from torch._inductor.utils import run_and_get_code

    p = DecodeProblem(kind, device)
    e_kc, e_vc, e_sl = p.clone_state()     # eager state
    c_kc, c_vc, c_sl = p.clone_state()     # compiled state
    ptrs = (c_kc.data_ptr(), c_vc.data_ptr())
    torch._dynamo.reset()
    compiled = torch.compile(p.fn, fullgraph=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for step in range(3):
            q, k, v = p.step_inputs(e_sl)
            eo, el = p.fn(*p.args(q, k, v, e_kc, e_vc, e_sl))
            if step == 0:
                (co, cl), codes = run_and_get_code(compiled, *p.args(q, k, v, c_kc, c_vc, c_sl))
                bad = _cache_copy_lines(codes, min(c_kc.numel(), c_vc.numel()))
                assert not bad, ("the compiled decode step copies a cache instead of writing it "
                                 "in place:\n" + "\n".join(bad))
            else:
                co, cl = compiled(*p.args(q, k, v, c_kc, c_vc, c_sl))
            # the compiled graph wrote the caches given to it, in place, as eager did
            assert (c_kc.data_ptr(), c_vc.data_ptr()) == ptrs
            assert torch.equal(c_kc, e_kc) and torch.equal(c_vc, e_vc)
            assert not torch.equal(c_kc, p.k_cache)
            torch.testing.assert_close(co, eo, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(cl, el, rtol=1e-6, atol=1e-6)
            e_sl += p.tq
            c_sl += p.tq


def test_chunked_prefill_compiled_dynamic_no_recompile(device):
    """Chunks of different lengths through one dynamic-shape graph (no recompile)."""
    p = DecodeProblem("contig", device, start=(0, 3))
    e_kc, e_vc, e_sl = p.clone_state()
    c_kc, c_vc, c_sl = p.clone_state()
    torch._dynamo.reset()
    compiled = torch.compile(decode_step, fullgraph=True, dynamic=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for tq in (3, 7, 5):   # none equal to another size (duck sizing would specialize)
            q, k, v = p.step_inputs(e_sl, tq)
            eo, el = decode_step(q, k, v, e_kc, e_vc, e_sl)
            co, cl = compiled(q, k, v, c_kc, c_vc, c_sl)
            assert torch.equal(c_kc, e_kc) and torch.equal(c_vc, e_vc)
            torch.testing.assert_close(co, eo, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(cl, el, rtol=1e-6, atol=1e-6)
            e_sl += tq
            c_sl += tq
