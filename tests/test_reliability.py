"""Regression tests of the reliability audit: each test failed before its fix.

1. mla_decode with zero heads crashed (SIGFPE): it skipped the head-count check its sibling makes; so did
   attention_with_kvcache over a paged cache of empty blocks with cache_leftpad (the block check divided by 0).
2. In-place ops accepted outputs that overlap themselves (expanded) or another argument.
3. In-place ops on tensors that autograd tracks, and double backward through attention, gave wrong
   gradients (or zeros) instead of an error.
4. A NaN in an input was hidden as "no visible key" (zeros, lse -inf) or depended on the thread count.
5. softcap / scale values that float32 cannot hold silently changed the result.
6. A size-1 dim with a huge stride (legal) failed with an internal BLAS message.
7. Messages that blamed the wrong argument or missed the cause.
"""
import re

import pytest
import torch

import attn_ops
import crash_isolation
from attn_ops.nn import GroupedQueryAttention, KVCache, PagedKVCache
from reference import assert_close_to_ref, attention_ref
from rope_reference import assert_rounded_once, rope_ref
from test_attention_backward import ref_grads, same_dtype_grads
from error_helpers import assert_unchanged, i32, snapshot


def _raises(msg, fn, *snapshot_of):
    """fn() raises RuntimeError/ValueError containing msg and leaves snapshot_of unchanged."""
    snap = snapshot(*snapshot_of)
    with pytest.raises((RuntimeError, ValueError), match=re.escape(msg)):
        fn()
    assert_unchanged(snap)


# ---- 1. mla_decode: head count checked, no crash ---------------------------------------------------

def _mla_zero_heads():
    attn_ops.mla_decode(torch.randn(1, 1, 0, 16), torch.randn(1, 1, 0, 4), torch.randn(1, 8, 20),
                        i32([3]), scale=0.1)


def _mla_zero_heads_paged():
    attn_ops.mla_decode(torch.randn(1, 1, 0, 16), torch.randn(1, 1, 0, 4), torch.randn(3, 4, 20),
                        i32([3]), scale=0.1, block_table=i32([[0, 1]]))


def _kvcache_empty_blocks_leftpad():
    """A paged cache of empty blocks ([num_blocks, 0, Hkv, D]: capacity 0) with cache_leftpad: the block check
    divided the left padding by the block size (SIGFPE)."""
    kc = torch.randn(4, 0, 2, 64)
    return attn_ops.attention_with_kvcache(torch.randn(1, 1, 2, 64), kc, kc.clone(), i32([0]),
                                           block_table=i32([[0]]), cache_leftpad=i32([0]))


CRASH_CASES = {"zero_heads": _mla_zero_heads, "zero_heads_paged": _mla_zero_heads_paged,
               "empty_blocks_leftpad": _kvcache_empty_blocks_leftpad}


def test_mla_decode_zero_heads_does_not_crash():
    names = ["zero_heads", "zero_heads_paged"]
    report = crash_isolation.crash_report("test_reliability", "CRASH_CASES", names, timeout=120)
    assert all(v is None for v in report.values()), report
    for name in names:
        _raises("attn_ops.mla_decode: q_latent must have at least 1 head, got 0", CRASH_CASES[name])


def test_paged_cache_of_empty_blocks_with_leftpad_does_not_crash():
    report = crash_isolation.crash_report("test_reliability", "CRASH_CASES", ["empty_blocks_leftpad"], timeout=120)
    assert report["empty_blocks_leftpad"] is None, report
    out, lse = _kvcache_empty_blocks_leftpad()  # no key: zeros and lse -inf, as any empty row
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()
    kc = torch.randn(4, 0, 2, 64)
    _raises("attn_ops.attention_with_kvcache: cache_seqlens[0] = 1 exceeds the cache capacity 0 (max_blocks_per_seq 1 "
            "x block_size 0)",
            lambda: attn_ops.attention_with_kvcache(torch.randn(1, 1, 2, 64), kc, kc.clone(), i32([1]),
                                                    block_table=i32([[0]]), cache_leftpad=i32([0])))


@pytest.mark.parametrize("batch, tq", [(0, 1), (2, 0), (0, 0)])
@pytest.mark.parametrize("paged", [False, True])
def test_mla_decode_empty_batch_or_queries(batch, tq, paged):
    """B = 0 or Tq = 0 is valid: empty outputs of the right shapes."""
    ql, qr = torch.randn(batch, tq, 4, 16), torch.randn(batch, tq, 4, 4)
    if paged:
        out, lse = attn_ops.mla_decode(ql, qr, torch.randn(3, 4, 20), i32([3] * batch), scale=0.1,
                                       block_table=torch.zeros(batch, 2, dtype=torch.int32))
    else:
        out, lse = attn_ops.mla_decode(ql, qr, torch.randn(batch, 8, 20), i32([3] * batch), scale=0.1)
    assert out.shape == (batch, tq, 4, 16) and lse.shape == (batch, 4, tq)


# ---- 2. in-place writes into overlapping memory ----------------------------------------------------

def test_rotary_inplace_refuses_expanded_x():
    x = torch.randn(1, 1, 2, 8).expand(3, 1, 2, 8)
    cos, sin = torch.randn(16, 4), torch.randn(16, 4)
    _raises("attn_ops.rotary_embedding_: x is written in place but some of its elements share memory",
            lambda: attn_ops.rotary_embedding_(x, cos, sin, i32([[0], [1], [2]])), x)


def test_rotary_inplace_refuses_x_aliasing_cos():
    table = torch.randn(16, 2)
    x = table.view(8, 1, 4)  # x is cos's memory
    _raises("attn_ops.rotary_embedding_: x is written in place and must not share memory with cos",
            lambda: attn_ops.rotary_embedding_(x, table, torch.randn(16, 2), torch.arange(8, dtype=torch.int32)),
            table)


def test_cache_appends_refuse_expanded_caches():
    kc = torch.randn(1, 8, 2, 4).expand(2, 8, 2, 4)
    vc = torch.randn(2, 8, 2, 4)
    k, v = torch.randn(2, 1, 2, 4), torch.randn(2, 1, 2, 4)
    _raises("attn_ops.kv_cache_append: k_cache is written in place but some of its elements share memory",
            lambda: attn_ops.kv_cache_append(kc, vc, k, v, i32([0, 1])), kc, vc)
    pkc = torch.randn(1, 4, 2, 4).expand(3, 4, 2, 4)
    _raises("attn_ops.paged_kv_cache_append: k_cache is written in place but some of its elements share memory",
            lambda: attn_ops.paged_kv_cache_append(pkc, torch.randn(3, 4, 2, 4), k[:, 0], v[:, 0], i32([0, 5])),
            pkc)
    lc = torch.randn(1, 8, 20).expand(2, 8, 20)
    _raises("attn_ops.mla_cache_append: latent_cache is written in place but some of its elements share memory",
            lambda: attn_ops.mla_cache_append(lc, torch.randn(2, 1, 16), torch.randn(2, 1, 4),
                                              cache_seqlens=i32([0, 1])), lc)


def test_cache_append_refuses_k_cache_that_is_v_cache():
    kc = torch.randn(2, 8, 2, 4)
    k, v = torch.randn(2, 1, 2, 4), torch.randn(2, 1, 2, 4)
    _raises("attn_ops.kv_cache_append: k_cache is written in place and must not share memory with v_cache",
            lambda: attn_ops.kv_cache_append(kc, kc, k, v, i32([0, 1])), kc)


def test_cache_append_refuses_source_inside_cache():
    kc, vc = torch.randn(1, 8, 2, 4), torch.randn(1, 8, 2, 4)
    k = kc[:, 2:3]  # the new keys are cache rows themselves (contiguous, partially overlapping)
    _raises("attn_ops.kv_cache_append: k_cache is written in place and must not share memory with k",
            lambda: attn_ops.kv_cache_append(kc, vc, k, torch.randn(1, 1, 2, 4), i32([0])), kc, vc)


def _kv_pair(layout):
    """(k_cache, v_cache) [B=2, T=8, H=2, D=4], or paged [blocks=3, 4, 2, 4], as two views of one buffer."""
    if layout == "kv_dim_1":        # [B, 2, T, H, D]: FlashInfer-style, K and V blocks of one row side by side
        kv = torch.randn(2, 2, 8, 2, 4)
        return kv[:, 0], kv[:, 1]
    if layout == "kv_dim_2":        # [B, T, 2, H, D]: K and V of one token side by side
        kv = torch.randn(2, 8, 2, 2, 4)
        return kv[:, :, 0], kv[:, :, 1]
    if layout == "paged_kv_dim_1":  # [blocks, 2, block_size, H, D] (vLLM's FlashInfer layout)
        kv = torch.randn(3, 2, 4, 2, 4)
        return kv[:, 0], kv[:, 1]
    buf = torch.randn(2, 8, 2, 12)  # "overlapping_columns": features 0..7 and 4..11 of one buffer
    return buf[..., 0:4], buf[..., 2:6]


@pytest.mark.parametrize("layout", ["kv_dim_1", "kv_dim_2", "paged_kv_dim_1"])
def test_cache_appends_accept_k_and_v_interleaved_in_one_buffer(layout):
    """K and V caches that are disjoint views of one buffer are not dense, so PyTorch's overlap test cannot tell
    ("too hard"); the exact test (common/memory_overlap.h) accepts them, and each write lands in its own view."""
    kc, vc = _kv_pair(layout)
    k, v = torch.randn(2, 1, 2, 4), torch.randn(2, 1, 2, 4)
    if layout.startswith("paged"):
        attn_ops.paged_kv_cache_append(kc, vc, k[:, 0], v[:, 0], i32([1, 9]))
        assert torch.equal(kc[0, 1], k[0, 0]) and torch.equal(vc[2, 1], v[1, 0])
    else:
        attn_ops.kv_cache_append(kc, vc, k, v, i32([3, 5]))
        assert torch.equal(kc[0, 3], k[0, 0]) and torch.equal(vc[1, 5], v[1, 0])


def test_in_place_ops_refuse_strided_outputs_that_overlap():
    """Overlaps that PyTorch's test leaves undecided for strided views, which were accepted and wrote garbage."""
    kc, vc = _kv_pair("overlapping_columns")
    k, v = torch.randn(2, 1, 2, 4), torch.randn(2, 1, 2, 4)
    _raises("attn_ops.kv_cache_append: k_cache is written in place and must not share memory with v_cache, but they "
            "overlap", lambda: attn_ops.kv_cache_append(kc, vc, k, v, i32([0, 1])), kc)
    head_major = torch.randn(2, 2, 8, 4)  # KVCache's [B, H, T, D] storage, seen as [B, T, H, D]
    kc, vc = head_major.transpose(1, 2), torch.randn(2, 8, 2, 4)
    _raises("attn_ops.kv_cache_append: k_cache is written in place and must not share memory with k, but they "
            "overlap", lambda: attn_ops.kv_cache_append(kc, vc, kc[:, 6:7], v, i32([0, 1])), head_major)
    latent = torch.randn(2, 8, 12)[:, :, :10]
    _raises("attn_ops.mla_cache_append: latent_cache is written in place and must not share memory with c_kv",
            lambda: attn_ops.mla_cache_append(latent, latent[:, 5:6, :8], torch.randn(2, 1, 2),
                                              cache_seqlens=i32([0, 1])), latent)
    table = torch.randn(16, 4)  # cos is its column 0; x [8, 1, 2] its columns 0..1 (overlap) or 2..3 (none)
    cos, sin, pos = table[:, :1], torch.randn(16, 1), torch.arange(8, dtype=torch.int32)
    _raises("attn_ops.rotary_embedding_: x is written in place and must not share memory with cos",
            lambda: attn_ops.rotary_embedding_(table.view(16, 1, 4)[:8, :, 0:2], cos, sin, pos), table)
    attn_ops.rotary_embedding_(table.view(16, 1, 4)[:8, :, 2:4], cos, sin, pos)
    rows_overlap = torch.randn(72).as_strided((2, 8, 2, 4), (32, 4, 4, 1))  # each token's heads overlap the next
    _raises("attn_ops.kv_cache_append: k_cache is written in place but some of its elements share memory",
            lambda: attn_ops.kv_cache_append(rows_overlap, torch.randn(2, 8, 2, 4), k, v, i32([0, 1])), rows_overlap)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_expanded_outputs_refused_on_meta_too(device):
    """The expand check is layout only: Meta kernels (torch.compile's fake tensors) refuse what the CPU does."""
    kc = torch.randn(1, 8, 2, 4, device=device).expand(2, 8, 2, 4)
    vc = torch.randn(2, 8, 2, 4, device=device)
    k = torch.randn(2, 1, 2, 4, device=device)
    with pytest.raises(RuntimeError, match="k_cache is written in place but some of its elements share memory"):
        attn_ops.kv_cache_append(kc, vc, k, k, i32([0, 1], device))
    state = torch.randn(1, 2, 4, 4, device=device).expand(2, 2, 4, 4)
    with pytest.raises(RuntimeError, match="state is written in place but some of its elements share memory"):
        attn_ops.lightning_attention_decode_(k, k, k, state, torch.full((2,), 0.3, device=device))


def _in_place_call(op, target_inference, others_inference):
    """(call, name of the written argument, written tensor) of in-place op `op` on small random inputs; the
    written tensor, and separately all the others, made under torch.inference_mode() when asked."""
    def made(inference, fn):
        with torch.inference_mode(inference):
            return fn()

    shapes = {"kv_cache_append": (2, 8, 2, 4), "paged_kv_cache_append": (2, 8, 2, 4), "mla_cache_append": (2, 8, 6),
              "rotary_embedding_": (2, 3, 2, 4), "lightning_attention_decode_": (2, 2, 4, 4)}
    target = made(target_inference, lambda: torch.randn(shapes[op]))
    vc, q, k, v, cos, sin, slope, lens, slots, pos = made(others_inference, lambda: (
        torch.randn(2, 8, 2, 4), torch.randn(2, 1, 2, 4), torch.randn(2, 1, 2, 4), torch.randn(2, 1, 2, 4),
        torch.randn(8, 2), torch.randn(8, 2), torch.rand(2), i32([0, 3]), i32([1, 9]),
        torch.arange(3, dtype=torch.int32).expand(2, 3)))
    calls = {
        "kv_cache_append": lambda: attn_ops.kv_cache_append(target, vc, k, v, lens),
        "paged_kv_cache_append": lambda: attn_ops.paged_kv_cache_append(target, vc, k[:, 0], v[:, 0], slots),
        "mla_cache_append": lambda: attn_ops.mla_cache_append(target, k[:, :, 0], k[:, :, 1, :2], cache_seqlens=lens),
        "rotary_embedding_": lambda: attn_ops.rotary_embedding_(target, cos, sin, pos),
        "lightning_attention_decode_": lambda: attn_ops.lightning_attention_decode_(q, k, v, target, slope),
    }
    names = {"kv_cache_append": "k_cache", "paged_kv_cache_append": "k_cache", "mla_cache_append": "latent_cache",
             "rotary_embedding_": "x", "lightning_attention_decode_": "state"}
    return calls[op], names[op], target


@pytest.mark.parametrize("others_inference", [False, True], ids=["others_normal", "others_inference"])
@pytest.mark.parametrize("op", ["kv_cache_append", "paged_kv_cache_append", "mla_cache_append", "rotary_embedding_",
                                "lightning_attention_decode_"])
def test_in_place_ops_refuse_inference_tensors_outside_inference_mode(op, others_inference):
    """A tensor made under torch.inference_mode() has no version counter, and PyTorch's in-place ops refuse to
    write one outside that mode. Ours raised only from the version bump after the write, or wrote it without a
    word when every argument was an inference tensor. Now: refused before the write, naming the argument (the
    caches' v_cache too, when the others are inference tensors); the same call runs under
    torch.inference_mode(), and outside it on tensors that are not inference tensors."""
    call, name, target = _in_place_call(op, True, others_inference)
    _raises(f"attn_ops.{op}: {name} is written in place but is an inference tensor (made under "
            "torch.inference_mode())", call, target)
    before = target.clone()
    with torch.inference_mode():
        call()
    assert not torch.equal(target, before)
    call, _, target = _in_place_call(op, False, False)
    before = target.clone()
    with torch.no_grad():
        call()
    assert not torch.equal(target, before)


# ---- 3. autograd: no silent wrong gradients -------------------------------------------------------

def test_rotary_inplace_refuses_leaf_requiring_grad():
    x = torch.randn(2, 3, 2, 8, requires_grad=True)
    cos, sin = torch.randn(8, 4), torch.randn(8, 4)
    pos = torch.arange(3, dtype=torch.int32).expand(2, 3)
    with pytest.raises(RuntimeError, match=re.escape(
            "attn_ops.rotary_embedding_: x requires grad, but attn_ops.rotary_embedding_ is not differentiable")):
        attn_ops.rotary_embedding_(x, cos, sin, pos)


def test_rotary_inplace_refuses_tensor_in_graph():
    w = torch.randn(2, 3, 2, 8, requires_grad=True)
    y = w * 2.0
    cos, sin = torch.randn(8, 4), torch.randn(8, 4)
    before = y.detach().clone()
    with pytest.raises(RuntimeError, match="x requires grad"):
        attn_ops.rotary_embedding_(y, cos, sin, torch.arange(3, dtype=torch.int32).expand(2, 3))
    assert torch.equal(y.detach(), before)


def test_rotary_inplace_bumps_version_so_saved_tensors_are_checked():
    """x saved for another op's backward, then rotated in place (grad mode off for the write): autograd
    must notice, as with any PyTorch in-place op."""
    w = torch.randn(2, 3, 2, 8, requires_grad=True)
    x = torch.randn(2, 3, 2, 8)
    y = (w * x).sum()  # mul saves x
    version = x._version
    with torch.no_grad():
        attn_ops.rotary_embedding_(x, torch.randn(8, 4), torch.randn(8, 4),
                                   torch.arange(3, dtype=torch.int32).expand(2, 3))
    assert x._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_rotary_inplace_under_no_grad_is_allowed():
    """A leaf that requires grad may be rotated in place under no_grad: the rotation is written (the values of
    the reference, from the cos / sin passed) and x's version advances."""
    x = torch.randn(2, 3, 2, 8, requires_grad=True)
    cos, sin = torch.randn(8, 4), torch.randn(8, 4)
    positions = torch.tensor([[5, 0, 7], [2, 2, 1]], dtype=torch.int32)
    x0, version = x.detach().clone(), x._version
    with torch.no_grad():
        attn_ops.rotary_embedding_(x, cos, sin, positions)
    assert x._version > version and x.requires_grad
    assert_rounded_once(x.detach(), rope_ref(x0, cos, sin, positions), x0)


def test_cache_append_refuses_cache_requiring_grad_but_stores_grad_values():
    kc = torch.randn(1, 8, 2, 4, requires_grad=True)
    vc = torch.randn(1, 8, 2, 4)
    k, v = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4)
    with pytest.raises(RuntimeError, match=re.escape(
            "attn_ops.kv_cache_append: k_cache requires grad, but attn_ops.kv_cache_append is not differentiable")):
        attn_ops.kv_cache_append(kc, vc, k, v, i32([0]))
    # Values that require grad are stored (a training forward that fills a cache); no gradient flows.
    kc = kc.detach()
    kg = k.clone().requires_grad_()
    attn_ops.kv_cache_append(kc, vc, kg, v, i32([3]))
    assert torch.equal(kc[0, 3], k[0, 0]) and not kc.requires_grad


def test_double_backward_through_attention_raises():
    q = torch.randn(1, 5, 2, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 5, 2, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 5, 2, 8, dtype=torch.float64, requires_grad=True)
    out, _ = attn_ops.attention(q, k, v, causal=True)
    with pytest.raises(RuntimeError, match="double backward .* is not supported"):
        (g,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
        g.sum().backward()
    # First-order gradients still work.
    out, _ = attn_ops.attention(q, k, v, causal=True)
    (g,) = torch.autograd.grad(out.square().sum(), q)
    assert torch.isfinite(g).all()


def _lightning_forward(q, k, v):
    return attn_ops.lightning_attention(q, k, v, torch.full((q.shape[2],), 0.3))[0]


def _additive_forward(q, k, v):  # qp, kp, v [B, T, A] from [B, T, 2, 3]
    q, k, v = (t.flatten(2) for t in (q, k, v))
    return attn_ops.additive_attention(q, k, torch.linspace(-1, 1, q.shape[-1], dtype=q.dtype), v)[0]


@pytest.mark.parametrize("forward", [_lightning_forward, _additive_forward], ids=["lightning", "additive"])
def test_double_backward_through_the_other_differentiable_ops_raises(forward):
    """lightning_attention_backward and additive_attention_backward had no autograd kernel: a second derivative
    came out as zeros with only a warning."""
    q, k, v = (torch.randn(1, 4, 2, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    with pytest.raises(RuntimeError, match="is the derivative of attn_ops.(lightning|additive)_attention, and double "
                                           "backward .* is not supported"):
        (g,) = torch.autograd.grad(forward(q, k, v).square().sum(), q, create_graph=True)
        g.sum().backward()
    (g,) = torch.autograd.grad(forward(q, k, v).square().sum(), q)  # first order still works
    assert torch.isfinite(g).all() and g.abs().sum() > 0


def _decode_ops(q_requires_grad):
    """The three decode ops' outputs for a q that requires grad (or not)."""
    q = torch.randn(2, 1, 4, 8, requires_grad=q_requires_grad)
    kc = torch.randn(2, 16, 2, 8)
    kv_out = attn_ops.attention_with_kvcache(q, kc, kc.clone(), i32([3, 5]))[0]
    mla_out = attn_ops.mla_decode(q, torch.randn(2, 1, 4, 4), torch.randn(2, 8, 12), i32([3, 5]), scale=0.3)[0]
    lightning_out = attn_ops.lightning_attention_decode_(q, q.detach()[:, :, :2], torch.randn(2, 1, 2, 8),
                                                         torch.zeros(2, 4, 8, 8), torch.full((4,), 0.3))
    return {"attention_with_kvcache": kv_out, "mla_decode": mla_out, "lightning_attention_decode_": lightning_out}


@pytest.mark.parametrize("op", ["attention_with_kvcache", "mla_decode", "lightning_attention_decode_"])
def test_backward_through_a_decode_op_raises(op):
    """The decode ops have no derivative. They still run in grad mode (a module decoding without
    torch.no_grad()), but a backward through their outputs raises; before, q silently got no gradient."""
    out = _decode_ops(True)[op]
    assert out.requires_grad
    with pytest.raises(RuntimeError, match=f"attn_ops.{op} is not differentiable: a backward reached its outputs"):
        out.sum().backward()
    with torch.no_grad():
        assert not _decode_ops(True)[op].requires_grad
    assert not _decode_ops(False)[op].requires_grad


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("op", ["attention_with_kvcache", "mla_decode", "lightning_attention_decode_"])
def test_decode_op_in_grad_mode_compiles_and_its_backward_raises(op, backend):
    """Compiled, a decode step in grad mode (q from a Linear, no torch.no_grad()) failed to compile: AOTAutograd
    traces the backward ahead, and the backward node raised while traced. It now raises only when a backward
    runs, with the eager message; the forward gives eager's outputs."""
    proj = torch.nn.Linear(8, 8)
    kc, vc = torch.randn(2, 16, 2, 8), torch.randn(2, 16, 2, 8)
    latent, q_rope = torch.randn(2, 8, 12), torch.randn(2, 1, 4, 4)
    k, v, state = torch.randn(2, 1, 2, 8), torch.randn(2, 1, 2, 8), torch.zeros(2, 4, 8, 8)
    lens, slope = i32([3, 5]), torch.full((4,), 0.3)
    decode = {
        "attention_with_kvcache": lambda q: attn_ops.attention_with_kvcache(q, kc, vc, lens)[0],
        "mla_decode": lambda q: attn_ops.mla_decode(q, q_rope, latent, lens, scale=0.3)[0],
        "lightning_attention_decode_": lambda q: attn_ops.lightning_attention_decode_(q, k, v, state.clone(), slope),
    }[op]

    def step(x):
        return decode(proj(x).view(2, 1, 4, 2).repeat(1, 1, 1, 4))  # q [2, 1, 4, 8] requires grad

    torch._dynamo.reset()
    x = torch.randn(2, 1, 8)
    compiled = torch.compile(step, fullgraph=True, backend=backend)
    out = compiled(x)
    torch.testing.assert_close(out, step(x), rtol=1e-5, atol=1e-5)
    assert out.requires_grad
    with pytest.raises(RuntimeError, match=f"attn_ops.{op} is not differentiable: a backward reached its outputs"):
        out.sum().backward()


def test_lightning_decode_bumps_the_state_version():
    """A graph that saved the pool state, which the decode then advanced, must not backpropagate through the new
    values silently (as kv_cache_append, it bumps the version counter of what it writes)."""
    state, x = torch.randn(2, 2, 3, 3), torch.randn(2, 2, 3, 3, requires_grad=True)
    y = (x * state).sum()
    q = torch.randn(2, 1, 2, 3)
    attn_ops.lightning_attention_decode_(q, q, q, state, torch.full((2,), 0.3))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


@pytest.mark.parametrize("shape", ["no_queries", "no_batch", "varlen_no_queries"])
def test_backward_of_an_empty_output(shape):
    """out.sum() over no element gives a stride-0 gradient, which .contiguous() leaves as it is: the check of the
    gradient's last stride refused it, so a rank or packed batch without queries could not train."""
    if shape == "varlen_no_queries":
        q, k, v = (torch.randn(n, 2, 4, dtype=torch.float64, requires_grad=True) for n in (0, 5, 5))
        out, _ = attn_ops.attention(q, k, v, cu_seqlens_q=i32([0, 0, 0]), cu_seqlens_k=i32([0, 2, 5]),
                                    max_seqlen_q=0, max_seqlen_k=3)
    else:
        b, tq = (2, 0) if shape == "no_queries" else (0, 3)
        q = torch.randn(b, tq, 2, 4, dtype=torch.float64, requires_grad=True)
        k, v = (torch.randn(b, 5, 1, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
        out, _ = attn_ops.attention(q, k, v)
    out.sum().backward()
    assert q.grad.shape == q.shape and torch.equal(k.grad, torch.zeros_like(k))
    x = torch.randn(1, 0, 2, 8, requires_grad=True)
    cos, sin = attn_ops.rotary_cos_sin(16, 8)
    attn_ops.rotary_embedding(x, cos, sin, torch.zeros(1, 0, dtype=torch.long)).sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_tiny_softcap_with_a_mask_gives_finite_gradients(dtype):
    """A masked key's logit is left uncapped, and with a tiny (accepted) softcap 1 - (s / cap)^2 overflowed
    to -inf there: 0 * -inf made dq / dk NaN."""
    cap = 1e-160 if dtype == torch.float64 else 1e-20
    leaves = [torch.randn(1, 6, 2, 8, dtype=dtype, requires_grad=True) for _ in range(3)]
    out, lse = attn_ops.attention(*leaves, causal=True, softcap=cap)
    dout = torch.linspace(-1, 1, 8, dtype=dtype).expand(out.shape)
    grads = torch.autograd.grad(out, leaves, dout)
    kw = dict(causal=True, softcap=cap)
    r64 = ref_grads(*leaves, dout, None, torch.float64, **kw)
    same = same_dtype_grads(*leaves, dout, None, **kw)
    for name, g, r, s in zip(("dq", "dk", "dv"), grads, r64, same):
        assert_close_to_ref(g, r, s, name=name)


# ---- 4. NaN propagates, deterministically ----------------------------------------------------------

def _with_threads(n, fn):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("tk", [7, 300, 1500])
def test_nan_propagates_to_the_rows_it_reaches(where, tk):
    B, Tq, H, D = 1, 3, 2, 16
    t = {"q": torch.randn(B, Tq, H, D), "k": torch.randn(B, tk, H, D), "v": torch.randn(B, tk, H, D)}
    t[where][0, 1 if where == "q" else tk // 2, 0, 3] = float("nan")
    results = [_with_threads(n, lambda: attn_ops.attention(t["q"], t["k"], t["v"])) for n in (1, 2)]
    for out, lse in results:
        if where == "q":  # only query row 1 of head 0
            assert torch.isnan(out[0, 1, 0]).all() and torch.isnan(lse[0, 0, 1])
            assert torch.isfinite(out[0, [0, 2]]).all() and torch.isfinite(out[0, :, 1]).all()
        elif where == "k":  # every query of head 0 sees the key
            assert torch.isnan(out[0, :, 0]).all() and torch.isnan(lse[0, 0]).all()
            assert torch.isfinite(out[0, :, 1]).all() and torch.isfinite(lse[0, 1]).all()
        else:  # v: the NaN feature of every row of head 0; lse unaffected
            assert torch.isnan(out[0, :, 0, 3]).all() and torch.isfinite(lse).all()
    (o1, l1), (o2, l2) = results
    assert torch.equal(torch.isnan(o1), torch.isnan(o2)) and torch.equal(torch.isnan(l1), torch.isnan(l2))


def test_nan_in_cache_reaches_decode_rows():
    kc, vc = torch.randn(2, 600, 2, 16), torch.randn(2, 600, 2, 16)
    kc[1, 400, 1, 0] = float("nan")
    for n in (1, 2):
        out, lse = _with_threads(n, lambda: attn_ops.attention_with_kvcache(
            torch.randn(2, 1, 4, 16), kc, vc, i32([500, 500])))
        assert torch.isnan(lse[1, 2:]).all() and torch.isnan(out[1, 0, 2:]).all()
        assert torch.isfinite(lse[0]).all() and torch.isfinite(lse[1, :2]).all()


def test_masked_rows_stay_zero_not_nan():
    """The other side of item 4: a row with no visible key is zeros with lse -inf, never NaN."""
    q, k, v = torch.randn(4, 1, 8), torch.randn(9, 1, 8), torch.randn(9, 1, 8)
    out, lse = attn_ops.attention(q, k[:0], v[:0], cu_seqlens_q=i32([0, 4]), cu_seqlens_k=i32([0, 0]))
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


# ---- 5. options float32 cannot hold ----------------------------------------------------------------

@pytest.mark.parametrize("softcap", [float("inf"), 1e39, 1e-50, float("nan")])
def test_softcap_out_of_float32_range_is_rejected(softcap):
    q = torch.randn(1, 3, 2, 8)
    with pytest.raises(RuntimeError, match=re.escape(
            "attn_ops.attention: softcap must be 0 (disabled) or in [1.17549e-38, 3.40282e+38] (representable in "
            "float32")):
        attn_ops.attention(q, q, q, softcap=softcap)


@pytest.mark.parametrize("op", ["attention", "attention_with_kvcache", "mla_decode"])
def test_scale_out_of_float32_range_is_rejected(op):
    msg = f"attn_ops.{op}: scale must be finite with |scale| <= 3.40282e+38 (representable in float32"
    with pytest.raises(RuntimeError, match=re.escape(msg)):
        if op == "attention":
            q = torch.randn(1, 3, 2, 8, dtype=torch.bfloat16)
            attn_ops.attention(q, q, q, scale=1e300)
        elif op == "attention_with_kvcache":
            kc = torch.randn(1, 4, 2, 8)
            attn_ops.attention_with_kvcache(torch.randn(1, 1, 2, 8), kc, kc.clone(), i32([3]), scale=-1e300)
        else:
            attn_ops.mla_decode(torch.randn(1, 1, 2, 16), torch.randn(1, 1, 2, 4), torch.randn(1, 8, 20), i32([3]),
                                scale=1e300)


def test_float64_keeps_its_range():
    q, k, v = (torch.randn(1, 3, 2, 8, dtype=torch.float64) for _ in range(3))
    out, _ = attn_ops.attention(q, k, v, softcap=1e-50)
    ref, _ = attention_ref(q, k, v, softcap=1e-50)
    torch.testing.assert_close(out, ref)


# ---- 6. size-1 dims with any stride -----------------------------------------------------------------

def test_size_one_dims_with_huge_strides():
    H, D = 2, 16
    base_q, base_k, base_v = torch.randn(1, 1, H, D), torch.randn(1, 1, H, D), torch.randn(1, 1, H, D)
    huge = 2 ** 40
    q = base_q.as_strided((1, 1, H, D), (huge, huge, D, 1))
    k = base_k.as_strided((1, 1, H, D), (huge, huge, D, 1))
    v = base_v.as_strided((1, 1, H, D), (huge, huge, D, 1))
    out, lse = attn_ops.attention(q, k, v)
    ref, ref_lse = attn_ops.attention(base_q, base_k, base_v)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    kc = torch.randn(1, 1, H, D).as_strided((1, 1, H, D), (huge, huge, D, 1))
    out, _ = attn_ops.attention_with_kvcache(q, kc, kc.clone(memory_format=torch.contiguous_format), i32([1]))
    assert torch.isfinite(out).all()


# ---- 7. messages that name the right argument and the cause ----------------------------------------

def test_module_batch_larger_than_cache_says_so():
    attn = GroupedQueryAttention(hidden_size=32, num_heads=4, num_kv_heads=2)
    cache = KVCache(num_layers=1, batch_size=2, capacity=16, num_kv_heads=2, head_dim=8)
    with torch.no_grad(), pytest.raises(ValueError, match=re.escape(
            "KVCache: the input has batch size 3, but the cache has only 2 rows")):
        attn(torch.randn(3, 2, 32), cache=cache)


def test_paged_module_without_reserve_names_reserve():
    attn = GroupedQueryAttention(hidden_size=32, num_heads=4, num_kv_heads=2)
    cache = PagedKVCache(num_layers=1, num_blocks=4, block_size=4, num_kv_heads=2, head_dim=8, batch_size=2,
                         max_blocks_per_seq=2)
    with torch.no_grad(), pytest.raises(RuntimeError, match=re.escape("call reserve(3)")):
        attn(torch.randn(2, 3, 32), cache=cache)


def test_paged_append_with_k_cache_on_meta_blames_k_cache():
    kc = torch.empty(4, 4, 2, 8, device="meta")
    msg = ("attn_ops.paged_kv_cache_append: k_cache, v_cache, k and v must be on the same device, got "
           "k_cache on meta, v_cache on cpu, k on cpu, v on cpu")
    with pytest.raises(RuntimeError, match=re.escape(msg)):
        attn_ops.paged_kv_cache_append(kc, torch.randn(4, 4, 2, 8), torch.randn(3, 2, 8), torch.randn(3, 2, 8),
                                       i32([0, 1, 2]))


def test_mla_decode_zero_rank_names_kv_lora_rank():
    with pytest.raises(RuntimeError, match=re.escape(
            "attn_ops.mla_decode: kv_lora_rank (the last dim of q_latent) must be at least 1, got 0")):
        attn_ops.mla_decode(torch.randn(1, 1, 2, 0), torch.randn(1, 1, 2, 4), torch.randn(1, 8, 4), i32([3]),
                            scale=0.1)


@pytest.mark.parametrize("op", ["attention_with_kvcache", "mla_decode"])
def test_zero_queries_is_valid(op):
    """docs: seqlen_q >= 0 (0 gives empty outputs), as the code does."""
    if op == "attention_with_kvcache":
        kc = torch.randn(2, 8, 2, 8)
        out, lse = attn_ops.attention_with_kvcache(torch.randn(2, 0, 4, 8), kc, kc.clone(), i32([3, 5]))
        assert out.shape == (2, 0, 4, 8) and lse.shape == (2, 4, 0)
    else:
        out, lse = attn_ops.mla_decode(torch.randn(2, 0, 4, 16), torch.randn(2, 0, 4, 4), torch.randn(2, 8, 20),
                                       i32([3, 5]), scale=0.1)
        assert out.shape == (2, 0, 4, 16) and lse.shape == (2, 4, 0)


def test_merge_attention_partials_propagates_nan():
    """The LSE merge, like the kernels, must not turn a NaN partial into 'no visible key'."""
    q, k, v = torch.randn(1, 3, 2, 8), torch.randn(1, 10, 2, 8), torch.randn(1, 10, 2, 8)
    k[0, 7, 1, 0] = float("nan")  # seen by head 1 (KV head 1) in the second shard only
    parts = [attn_ops.attention(q, k[:, s], v[:, s]) for s in (slice(0, 5), slice(5, 10))]
    out, lse = attn_ops.merge_attention_partials([p[0] for p in parts], [p[1] for p in parts])
    assert torch.isnan(lse[0, 1]).all() and torch.isnan(out[0, :, 1]).all()
    assert torch.isfinite(lse[0, 0]).all() and torch.isfinite(out[0, :, 0]).all()


def _lightning_zero_dv():
    q = torch.randn(3, 9, 2, 4, dtype=torch.float64)
    attn_ops.lightning_attention(q, q.clone(), torch.randn(3, 9, 2, 0, dtype=torch.float64),
                                 torch.rand(2), block_size=4)


CRASH_CASES["lightning_zero_dv"] = _lightning_zero_dv


def test_lightning_zero_head_dim_is_rejected_not_a_crash():
    """Found by tests/test_fuzz.py: head_dim_v = 0 divided by zero (SIGFPE) in the CPU kernel."""
    report = crash_isolation.crash_report("test_reliability", "CRASH_CASES", ["lightning_zero_dv"], timeout=120)
    assert report["lightning_zero_dv"] is None, report
    _raises("attn_ops.lightning_attention: head_dim_qk and head_dim_v must be at least 1, got 4 and 0",
            _lightning_zero_dv)


def test_lightning_scale_out_of_float32_range_is_rejected():
    q = torch.randn(1, 5, 2, 8)
    with pytest.raises(RuntimeError, match=re.escape(
            "attn_ops.lightning_attention: scale must be finite with |scale| <= 3.40282e+38")):
        attn_ops.lightning_attention(q, q, q, torch.rand(2), scale=1e300)
