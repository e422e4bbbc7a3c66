"""attn_ops.nn: the attention modules against a plain-PyTorch (HuggingFace eager style) reference
module loaded with the same state_dict, training gradients, cached inference (prefill + decode equals
the full-sequence forward, contiguous and paged caches, ragged prompts), torch.compile of a decode
step, and the cache objects' host-side behaviour.

Tolerance for the reference comparisons: reference.assert_close_to_ref (|ours - ref64| <=
2 * |same_dtype - ref64| + eps), where ref64 is the reference module in float64 and same_dtype the
reference module in the module's dtype (HF eager: RoPE tables cast to the dtype, softmax in float32).
The reference's rotary tables and convention come from the configuration (rope_reference's formula),
never from the module's own rope_cos / rope_sin, which would hide a wrong theta.
"""

import math

import pytest
import torch
import torch.nn as nn

import attn_ops
from attn_ops.nn import (GroupedQueryAttention, KVCache, MultiHeadAttention, MultiHeadLatentAttention,
                         MultiQueryAttention, OutOfBlocksError, PagedKVCache)
from reference import assert_close_to_ref
from rope_reference import assert_table_from_formula, cos_sin_formula
from model_helpers import (cache_factory, cached_step, check_paged_equals_contiguous,
                           check_prefill_then_decode, check_ragged_prompts_right_padded, default_positions,
                           make_cache_of, rand_x, randomize_vectors, rotate_half, stack_of)

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
DT_IDS = ["f32", "f64", "bf16", "f16"]


# --------------------------------------------------------------------------------------------------
# Plain-PyTorch reference (HF eager attention: rotate_half RoPE, repeat_kv, masked softmax)
# --------------------------------------------------------------------------------------------------
def rotate_every_two(x):
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def repeat_kv(x, n_rep):
    """[B, Hkv, T, D] -> [B, Hkv * n_rep, T, D] (HF's repeat_kv)."""
    B, Hkv, T, D = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None].expand(B, Hkv, n_rep, T, D).reshape(B, Hkv * n_rep, T, D)


def geometric_alibi_slopes(num_heads):
    """The ALiBi paper's slopes (BLOOM's build_alibi_tensor): 2^(-8/n)^k for the largest power of two n <= heads,
    then the odd powers of 2^(-4/n) for the rest."""
    n = 2 ** math.floor(math.log2(num_heads))
    slopes = [(2.0 ** (-8.0 / n)) ** k for k in range(1, n + 1)]
    slopes += [(2.0 ** (-4.0 / n)) ** (2 * i + 1) for i in range(num_heads - n)]
    return torch.tensor(slopes, dtype=torch.float64)


class RefAttention(nn.Module):
    """The GroupedQueryAttention computation written out in plain PyTorch, same parameter names."""

    def __init__(self, hidden_size, num_heads, num_kv_heads, head_dim, bias, sliding_window,
                 interleaved, sinks=False, chunk=0, alibi=False):
        super().__init__()
        self.h, self.hkv, self.d = num_heads, num_kv_heads, head_dim
        self.window, self.interleaved, self.chunk, self.alibi = sliding_window, interleaved, chunk, alibi
        # gpt-oss eager: one more score column per head, dropped after the softmax
        self.sinks = nn.Parameter(torch.zeros(num_heads)) if sinks else None
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)

    @classmethod
    def like(cls, mod, dtype, interleaved):
        """`mod`'s weights in `dtype`; the rotary convention is the caller's (from the configuration)."""
        ref = cls(mod.hidden_size, mod.num_heads, mod.num_kv_heads, mod.head_dim,
                  mod.q_proj.bias is not None, mod.sliding_window, interleaved, mod.sinks is not None,
                  mod.attention_chunk, mod.alibi)
        ref = ref.to(device=mod.q_proj.weight.device, dtype=dtype)
        ref.load_state_dict(mod.state_dict())  # casts the module's values into `dtype`
        return ref

    def forward(self, x, cos_table, sin_table, positions):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.h, self.d).transpose(1, 2)      # [B, H, T, D]
        k = self.k_proj(x).view(B, T, self.hkv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.hkv, self.d).transpose(1, 2)
        cos, sin = cos_table[positions], sin_table[positions]                # [B, T, D/2]
        if self.interleaved:
            cos, sin, rot = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1), rotate_every_two
        else:
            cos, sin, rot = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1), rotate_half
        cos, sin = cos.unsqueeze(1).to(x.dtype), sin.unsqueeze(1).to(x.dtype)
        if not self.alibi:  # BLOOM / MPT: no rotary embedding
            q = q * cos + rot(q) * sin
            k = k * cos + rot(k) * sin
        k, v = repeat_kv(k, self.h // self.hkv), repeat_kv(v, self.h // self.hkv)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.d)
        i = torch.arange(T, device=x.device)[:, None]
        j = torch.arange(T, device=x.device)[None, :]
        if self.alibi:  # BLOOM's bias, in the scores' dtype
            slopes = geometric_alibi_slopes(self.h).to(x.device, scores.dtype)
            scores = scores - slopes.view(1, -1, 1, 1) * (i - j).abs().to(scores.dtype)
        visible = j <= i
        if self.window is not None:
            visible = visible & (i - j < self.window)
        if self.chunk:  # Llama 4's chunked layers
            visible = visible & (i // self.chunk == j // self.chunk)
        scores = scores.masked_fill(~visible, float("-inf"))
        if self.sinks is not None:
            scores = torch.cat([scores, self.sinks.to(scores.dtype).view(1, -1, 1, 1).expand(B, -1, T, 1)], -1)
        # HF eager: softmax in float32 for low-precision inputs (float64 stays float64)
        p = torch.softmax(scores, dim=-1, dtype=torch.promote_types(q.dtype, torch.float32))
        p = p[..., :T].to(q.dtype)
        out = torch.matmul(p, v).transpose(1, 2).reshape(B, T, self.h * self.d)
        return self.o_proj(out)


def ref_stack_forward(name):
    """The reference of a Stack of CONFIGS[name] modules in `dtype` (full sequence), as
    check_prefill_then_decode calls it."""
    cos, sin = config_tables(name)
    interleaved = CONFIGS[name].get("rope_interleaved", False)

    def forward(stack, x, positions, dtype):
        x = x.to(dtype)
        for layer in stack.layers:
            x = x + RefAttention.like(layer, dtype, interleaved)(x, cos, sin, positions)
        return x
    return forward


# --------------------------------------------------------------------------------------------------
# Module configurations
# --------------------------------------------------------------------------------------------------
CONFIGS = {
    "gqa": dict(hidden_size=64, num_heads=4, num_kv_heads=2),
    "mqa": dict(cls=MultiQueryAttention, hidden_size=64, num_heads=4),
    "mha_headdim32": dict(cls=MultiHeadAttention, hidden_size=48, num_heads=3, head_dim=32),
    "qwen2_bias": dict(hidden_size=64, num_heads=4, num_kv_heads=2, bias=True, rope_theta=1e6),
    "interleaved": dict(hidden_size=64, num_heads=4, num_kv_heads=1, rope_interleaved=True),
    "window5": dict(hidden_size=64, num_heads=4, num_kv_heads=2, sliding_window=5),
    # a window of 3 keys: with 1 each query sees only itself, and the output (v) hides rotary and q / k biases
    "window3_bias_interleaved": dict(hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16,
                                     bias=True, sliding_window=3, rope_interleaved=True),
    "window1": dict(hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16, sliding_window=1),
    # gpt-oss's sliding layers (learned sinks, a window) and Llama 4's chunked layers
    "sinks_window4": dict(hidden_size=64, num_heads=4, num_kv_heads=2, sliding_window=4, sinks=True),
    "chunk6": dict(hidden_size=64, num_heads=4, num_kv_heads=1, attention_chunk=6),
    # BLOOM / MPT: ALiBi, no rotary; 6 heads take the slopes of the rule for head counts off a power of two
    "alibi_mha": dict(hidden_size=64, num_heads=4, num_kv_heads=4, alibi=True),
    "alibi6_gqa": dict(hidden_size=48, num_heads=6, num_kv_heads=2, head_dim=8, alibi=True),
}


def build(name, dtype, device, max_pos=256):
    cfg = dict(CONFIGS[name])
    cls = cfg.pop("cls", GroupedQueryAttention)
    return randomize_vectors(cls(max_position_embeddings=max_pos, **cfg).to(device=device, dtype=dtype))


def config_tables(name, max_pos=256):
    """float64 cos / sin [max_pos, head_dim / 2] of CONFIGS[name] from its own rope_theta and head_dim (the
    constructor's defaults 10000 and hidden_size // num_heads when absent): independent of the module."""
    cfg = CONFIGS[name]
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_heads"])
    return cos_sin_formula(max_pos, head_dim, cfg.get("rope_theta", 10000.0))


def reference(name, mod, dtype, device):
    """(RefAttention of `mod` in `dtype`, cos, sin): convention and tables from CONFIGS[name]."""
    cos, sin = config_tables(name)
    ref = RefAttention.like(mod, dtype, CONFIGS[name].get("rope_interleaved", False))
    return ref, cos.to(device), sin.to(device)


# --------------------------------------------------------------------------------------------------
# Module structure
# --------------------------------------------------------------------------------------------------
def test_module_structure(device):
    m = GroupedQueryAttention(64, 8, 2, bias=True, rope_theta=1e6, device=device)
    names = {n: tuple(p.shape) for n, p in m.named_parameters()}
    assert names == {"q_proj.weight": (64, 64), "q_proj.bias": (64,), "k_proj.weight": (16, 64),
                     "k_proj.bias": (16,), "v_proj.weight": (16, 64), "v_proj.bias": (16,),
                     "o_proj.weight": (64, 64)}
    assert set(m.state_dict()) == set(names)          # rotary tables are non-persistent
    assert m.rope_cos.shape == (4096, 4) and m.rope_cos.dtype == torch.float32
    exact_cos, exact_sin = cos_sin_formula(4096, 8, 1e6)
    assert_table_from_formula(m.rope_cos, exact_cos, "rope_cos")
    assert_table_from_formula(m.rope_sin, exact_sin, "rope_sin")
    cos, sin = m.rope_cos.clone(), m.rope_sin.clone()
    m = m.to(torch.bfloat16)
    assert m.q_proj.weight.dtype == torch.bfloat16 and m.rope_cos.dtype == torch.float32
    assert torch.equal(m.rope_cos, cos) and torch.equal(m.rope_sin, sin)
    # a float64 module has float64 tables, computed in float64, whatever dtype it was built in
    m = m.double()
    assert m.rope_cos.dtype == torch.float64
    assert_table_from_formula(m.rope_cos, exact_cos, "float64 rope_cos")
    assert_table_from_formula(m.rope_sin, exact_sin, "float64 rope_sin")
    cos64 = m.rope_cos.clone()
    m = m.float()
    assert m.rope_cos.dtype == torch.float32 and torch.equal(m.rope_cos, cos64.float())
    # tables the caller wrote (YaRN) survive every cast, in the table dtype of the module's
    m.rope_cos.mul_(0.5)
    custom = m.rope_cos.clone()
    assert torch.equal(m.to(torch.bfloat16).rope_cos, custom)
    assert torch.equal(m.double().rope_cos, custom.double())
    assert MultiQueryAttention(64, 4).num_kv_heads == 1
    mha = MultiHeadAttention(64, 4, head_dim=32)
    assert mha.num_kv_heads == 4 and mha.q_proj.weight.shape == (128, 64)
    assert GroupedQueryAttention(64, 4, 2, sliding_window=7).window_left == 6
    assert GroupedQueryAttention(64, 4, 2).window_left == -1
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        GroupedQueryAttention(64, 6, 4, head_dim=16)


# --------------------------------------------------------------------------------------------------
# Forward and backward against the reference module
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward_matches_reference(name, dtype, device):
    mod = build(name, dtype, device)
    B, T = 2, 19
    x = rand_x(B, T, mod.hidden_size, dtype, device)
    pos = default_positions(B, T, device)
    with torch.no_grad():
        out = mod(x)
        r64, cos, sin = reference(name, mod, torch.float64, device)
        ref64 = r64(x.double(), cos, sin, pos)
        same = reference(name, mod, dtype, device)[0](x, cos, sin, pos)
    assert out.shape == (B, T, mod.hidden_size) and out.dtype == dtype
    assert_close_to_ref(out, ref64, same, name="out")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_explicit_positions(dtype, device):
    """positions [B, T] (per row) and [T] (shared) rotate at those positions."""
    mod = build("qwen2_bias", dtype, device)
    B, T = 3, 11
    x = rand_x(B, T, mod.hidden_size, dtype, device)
    pos2d = torch.stack([torch.randperm(200, device=device)[:T] for _ in range(B)])
    pos1d = torch.arange(T, device=device) + 37
    for pos in (pos2d, pos1d):
        posb = pos.expand(B, T)
        with torch.no_grad():
            out = mod(x, positions=pos)
            r64, cos, sin = reference("qwen2_bias", mod, torch.float64, device)
            ref64 = r64(x.double(), cos, sin, posb)
            same = reference("qwen2_bias", mod, dtype, device)[0](x, cos, sin, posb)
        assert_close_to_ref(out, ref64, same, name="out")


def test_gqa_softmax_scale():
    """softmax_scale (one name in every attention module) reaches the op, uncached and cached. The rotary
    tables are the formula's for the constructor's rope_theta, not the module's buffers."""
    torch.manual_seed(0)
    mod = GroupedQueryAttention(32, 4, 2, dtype=torch.float64, softmax_scale=0.3, rope_theta=1e6)
    assert mod.softmax_scale == 0.3 and "softmax_scale=0.3" in repr(mod)
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    q = mod.q_proj(x).view(2, 5, 4, 8)
    k, v = (p(x).view(2, 5, 2, 8) for p in (mod.k_proj, mod.v_proj))
    pos = torch.arange(5).expand(2, 5)
    cos, sin = cos_sin_formula(5, 8, 1e6)
    q, k = (attn_ops.rotary_embedding(t, cos, sin, pos) for t in (q, k))
    ref, _ = attn_ops.attention(q, k, v, scale=0.3, causal=True)
    ref = mod.o_proj(ref.reshape(2, 5, 32))
    torch.testing.assert_close(mod(x), ref, rtol=1e-12, atol=1e-12)
    cache = KVCache(1, 2, 5, 2, 8, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(mod(x, cache=cache), ref, rtol=1e-12, atol=1e-12)
    assert GroupedQueryAttention(32, 4, 2).softmax_scale == 1.0 / 8 ** 0.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16], ids=["f32", "f64", "f16"])
@pytest.mark.parametrize("name", ["gqa", "qwen2_bias", "interleaved", "window5",
                                  "window3_bias_interleaved", "sinks_window4", "chunk6", "alibi6_gqa"])
def test_backward_matches_reference(name, dtype, device):
    mod = build(name, dtype, device)
    B, T = 2, 17
    x0 = rand_x(B, T, mod.hidden_size, dtype, device)
    w = torch.randn(B, T, mod.hidden_size, device=device, dtype=dtype)
    pos = default_positions(B, T, device)

    def grads(fn, params, xdt):
        x = x0.detach().to(xdt).clone().requires_grad_()
        loss = (fn(x) * w.to(xdt)).sum()
        loss.backward()
        return {"x": x.grad, **{n: p.grad for n, p in params}}

    ours = grads(mod, list(mod.named_parameters()), dtype)
    r64, cos, sin = reference(name, mod, torch.float64, device)
    g64 = grads(lambda x: r64(x, cos, sin, pos), list(r64.named_parameters()), torch.float64)
    rs = reference(name, mod, dtype, device)[0]
    gs = grads(lambda x: rs(x, cos, sin, pos), list(rs.named_parameters()), dtype)
    assert set(ours) == set(g64)
    for n in ours:
        assert ours[n] is not None, n
        # The sinks' gradient sums P_sink * rowsum(dout * out) over every row, out rounded to the dtype first (as
        # FlashAttention's delta is): that rounding is the floor's rounded intermediate.
        assert_close_to_ref(ours[n], g64[n], gs[n], name=f"grad {n}", rounded_intermediates=n == "sinks")


# --------------------------------------------------------------------------------------------------
# Cached inference
# --------------------------------------------------------------------------------------------------
def make_cache(kind, num_layers, B, capacity, mod, dtype, device, spare_blocks=3):
    Hkv, D, kw = mod.num_kv_heads, mod.head_dim, dict(dtype=dtype, device=device)
    return make_cache_of(kind, B, capacity, lambda cap: KVCache(num_layers, B, cap, Hkv, D, **kw),
                         lambda nb, bs, mb: PagedKVCache(num_layers, nb, bs, Hkv, D, B, mb, **kw),
                         spare_blocks)


CACHE_KINDS = ["contig", "paged1", "paged16"]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("name", ["gqa", "window5", "qwen2_bias", "sinks_window4", "chunk6", "alibi_mha"])
@pytest.mark.parametrize("kind", CACHE_KINDS)
def test_prefill_then_decode_matches_full_forward(kind, name, dtype, device):
    """model_helpers.check_prefill_then_decode through a 2-layer stack sharing one cache (bfloat16:
    against the reference only)."""
    stack = stack_of(build, name, dtype, device)
    full_tol = {torch.float64: 1e-10, torch.float32: 2e-5}.get(dtype)
    check_prefill_then_decode(stack, cache_factory(make_cache, stack, dtype, device, kind), ref_stack_forward(name),
                              dtype, device, full_tol)


@pytest.mark.parametrize("kind", ["contig", "paged4", "paged16"])
def test_ragged_prompts_right_padded(kind, device):
    stack = stack_of(build, "window5", torch.float32, device)
    check_ragged_prompts_right_padded(stack, cache_factory(make_cache, stack, torch.float32, device, kind),
                                      torch.float32, device, tol=2e-5)


@pytest.mark.parametrize("block_size", [1, 16])
def test_paged_equals_contiguous(block_size, device):
    stack = stack_of(build, "gqa", torch.float32, device)
    check_paged_equals_contiguous(stack, cache_factory(make_cache, stack, torch.float32, device), block_size,
                                  lambda cache, layer: (cache.k[layer], cache.v[layer]), device)


# --------------------------------------------------------------------------------------------------
# torch.compile
# --------------------------------------------------------------------------------------------------
def test_module_forward_no_graph_break(device):
    mod = build("window5", torch.float32, device)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(mod)(rand_x(2, 9, mod.hidden_size, torch.float32, device))
    assert explanation.graph_break_count == 0, explanation.break_reasons


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("kind", ["contig", "paged16"])
def test_compiled_decode_step(kind, dynamic, device):
    """A decode step (module forward with a cache: rotary in place, append, attend, advance) under
    torch.compile(fullgraph=True): no graph break, eager's results, the caches written in place. With
    dynamic=True too: in-place writes to a view whose offset depends on a dynamic size land at its base's
    start there (README), so this also checks that the module's rotary slices and cache layers are not such
    views."""
    dtype = torch.float32
    stack = stack_of(build, "window5", dtype, device)
    E = stack.layers[0].hidden_size
    B, P = 2, 9
    caches = {n: make_cache(kind, 2, B, 16, stack.layers[0], dtype, device)
              for n in ("eager", "compiled", "explain")}
    prompt = rand_x(B, P, E, dtype, device)
    with torch.no_grad():
        for c in caches.values():
            cached_step(stack, prompt, c)
    ce, cc, cx = caches["eager"], caches["compiled"], caches["explain"]

    def step(x, cache):
        with torch.no_grad():
            return stack(x, cache=cache)

    torch._dynamo.reset()
    if kind != "contig":
        cx.reserve(1)
    explanation = torch._dynamo.explain(step)(rand_x(B, 1, E, dtype, device), cx)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=dynamic)
    ptrs = [t.data_ptr() for t in cc.k + cc.v + [cc.seqlens]]
    for i in range(3):
        if kind != "contig":
            ce.reserve(1)
            cc.reserve(1)
        x = rand_x(B, 1, E, dtype, device)
        before = [t.clone() for t in cc.k + cc.v]
        eo = step(x, ce)
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            co = compiled(x, cc)
        torch.testing.assert_close(co, eo, rtol=1e-5, atol=1e-5)
        assert [t.data_ptr() for t in cc.k + cc.v + [cc.seqlens]] == ptrs
        assert cc.lengths().tolist() == ce.lengths().tolist() == [P + i + 1] * B
        for tc, te, tb in zip(cc.k + cc.v, ce.k + ce.v, before):
            assert not torch.equal(tc, tb)          # the step wrote into the cache in place
            torch.testing.assert_close(tc, te, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------------
# Cache objects
# --------------------------------------------------------------------------------------------------
def test_kvcache_host_methods(device):
    c = KVCache(2, 3, 10, 2, 8, dtype=torch.float32, device=device)
    assert c.capacity == 10 and c.num_layers == 2 and c.batch_size == 3
    assert c.nbytes == 2 * 2 * 3 * 10 * 2 * 8 * 4
    assert c.bytes_per_token == 2 * 2 * 2 * 8 * 4
    assert c.k[0].shape == (3, 10, 2, 8) and c.seqlens.dtype == torch.int32
    for t in c.k + c.v:  # on the CPU each KV head's rows are contiguous (the decode kernel's fast layout)
        assert t.transpose(1, 2).is_contiguous() == (device == "cpu") and t.is_contiguous() == (device != "cpu")
    assert c.lengths().tolist() == [0, 0, 0]
    c.advance(4)
    lengths = c.lengths()
    lengths.fill_(9)                                 # a copy
    assert c.lengths().tolist() == [4, 4, 4]
    c.advance(2, batch_size=2)
    assert c.lengths().tolist() == [6, 6, 4]
    c.free_rows([1])
    assert c.lengths().tolist() == [6, 0, 4]
    c.truncate([2])
    assert c.lengths().tolist() == [2, 0, 4]
    with pytest.raises(ValueError, match=r"lengths\[1\] = 1 must be in \[0, 0\]"):
        c.truncate([2, 1])
    with pytest.raises(ValueError, match=r"^KVCache.truncate: lengths must be integers, got torch.float32$"):
        c.truncate([1.7])  # it became 1
    assert c.lengths().tolist() == [2, 0, 4]
    with pytest.raises(IndexError):
        c.free_rows([3])
    c.reset()
    assert c.lengths().tolist() == [0, 0, 0]


@pytest.mark.host_value_check
def test_kvcache_capacity_error_surfaces(device):
    """Appending past the capacity: the op's RuntimeError, nothing written, lengths unchanged."""
    stack = stack_of(build, "gqa", torch.float32, device)
    E = stack.layers[0].hidden_size
    cache = make_cache("contig", 2, 2, 8, stack.layers[0], torch.float32, device)
    with torch.no_grad():
        stack(rand_x(2, 6, E, torch.float32, device), cache=cache)
        before = [t.clone() for t in cache.k + cache.v]
        with pytest.raises(RuntimeError, match="exceeds the cache capacity 8"):
            stack(rand_x(2, 3, E, torch.float32, device), cache=cache)
    assert cache.lengths().tolist() == [6, 6]
    assert all(torch.equal(a, b) for a, b in zip(before, cache.k + cache.v))


def test_smaller_batch_than_cache(device):
    """A forward with B rows uses rows 0 .. B-1 of a larger cache and leaves the others alone."""
    mod = build("gqa", torch.float32, device)
    x = rand_x(2, 5, mod.hidden_size, torch.float32, device)
    for kind in ("contig", "paged4"):
        cache = make_cache(kind, 1, 3, 8, mod, torch.float32, device)
        with torch.no_grad():
            if kind != "contig":
                cache.reserve([5, 5])
            out = mod(x, cache=cache)
            torch.testing.assert_close(out, mod(x), rtol=2e-5, atol=2e-5)
        assert cache.lengths().tolist() == [5, 5, 0]


def test_paged_allocator(device):
    c = PagedKVCache(1, 6, 4, 2, 8, 2, 3, device=device)
    assert c.capacity == 12 and c.num_free_blocks == 6
    for t in c.k + c.v:  # on the CPU each KV head's rows within a block are contiguous (as in KVCache)
        assert t.shape == (6, 4, 2, 8)
        assert t.transpose(1, 2).is_contiguous() == (device == "cpu") and t.is_contiguous() == (device != "cpu")
    assert c.nbytes == 2 * 6 * 4 * 2 * 8 * 4
    assert c.reserve(5) == 4                                   # 2 blocks per row, round-robin
    assert c.row_blocks(0) == [0, 2] and c.row_blocks(1) == [1, 3]
    assert c.block_table.tolist() == [[0, 2, 6], [1, 3, 6]]    # 6 = num_blocks: not assigned
    c.advance(5)
    assert c.reserve(3) == 0                                   # 8 tokens still fit in 2 blocks
    c.advance(3)
    assert c.reserve(1) == 2
    assert c.row_blocks(0) == [0, 2, 4] and c.row_blocks(1) == [1, 3, 5] and c.num_free_blocks == 0
    c.advance(1)
    with pytest.raises(RuntimeError, match=r"row 1 would hold 13 tokens, more than its capacity 12"):
        c.reserve([0, 4])
    c.free_rows([0])
    assert c.num_free_blocks == 3 and c.lengths().tolist() == [0, 9]
    assert c.block_table[0].tolist() == [6, 6, 6]
    assert c.reserve([6]) == 2
    assert c.row_blocks(0) == [0, 2]                           # freed blocks are reused in order
    c.reset()
    assert c.num_free_blocks == 6 and c.lengths().tolist() == [0, 0]
    assert c.block_table.tolist() == [[6, 6, 6], [6, 6, 6]]


def test_paged_out_of_blocks(device):
    c = PagedKVCache(2, 3, 4, 2, 8, 2, 3, device=device)
    with pytest.raises(OutOfBlocksError, match=r"out of KV-cache blocks: the next tokens need 4 "
                                               r"more blocks of 4 tokens, 3 of 3 are free"):
        c.reserve(5)
    assert issubclass(OutOfBlocksError, RuntimeError)
    assert c.num_free_blocks == 3 and c.row_blocks(0) == [] and c.row_blocks(1) == []
    assert c.reserve([5]) == 2


def test_paged_truncate_frees_blocks(device):
    c = PagedKVCache(1, 8, 4, 2, 8, 2, 3, device=device)
    c.reserve(11)
    c.advance(11)
    assert c.num_free_blocks == 2
    c.truncate([3, 9])
    assert c.lengths().tolist() == [3, 9]
    assert len(c.row_blocks(0)) == 1 and len(c.row_blocks(1)) == 3 and c.num_free_blocks == 4
    assert c.block_table[0, 1:].tolist() == [8, 8]


def test_paged_reserve_and_free_rows_take_integers_only():
    """reserve(torch.tensor(5)) / reserve(np.int64(5)) reserved for row 0 only (only a Python int meant every row)
    and 4.9 became 4; free_rows with a bool mask freed rows 0 and 1 (True / False as indices)."""
    np = pytest.importorskip("numpy")
    for count in (5, torch.tensor(5), np.int64(5)):
        c = PagedKVCache(1, 12, 4, 1, 8, 3, 4)
        assert c.reserve(count) == 6 and [len(c.row_blocks(r)) for r in range(3)] == [2, 2, 2]
    c = PagedKVCache(1, 12, 4, 1, 8, 3, 4)
    for bad, dtype in ((4.9, "torch.float32"), (True, "torch.bool"), ([2, 1.5], "torch.float32")):
        with pytest.raises(ValueError, match=rf"^PagedKVCache.reserve: num_new_tokens must be integers, got {dtype}$"):
            c.reserve(bad)
    assert c.num_free_blocks == 12
    c.reserve(4)
    for bad in (torch.tensor([True, False, False]), [1.9]):
        with pytest.raises(ValueError,
                           match=r"^PagedKVCache.free_rows: rows must be integers, got torch\.(bool|float32)$"):
            c.free_rows(bad)
    assert [len(c.row_blocks(r)) for r in range(3)] == [1, 1, 1]
    with pytest.raises(ValueError, match=r"^KVCache.free_rows: rows must be integers, got torch.bool$"):
        KVCache(1, 3, 8, 1, 8).free_rows(torch.tensor([False, False, True]))


@pytest.mark.parametrize("kind", ["gqa", "mla"])
def test_meta_init_then_to_empty_computes_the_rotary_tables(kind):
    """A meta-device init, to_empty() and load_state_dict(): the rotary tables are non-persistent buffers, so
    nothing restored them and the outputs were NaN (uninitialised memory). Leaving meta now computes them,
    with the module's own theta (not the default)."""
    if kind == "gqa":
        make = lambda device: GroupedQueryAttention(32, 4, 2, rope_theta=5e5, device=device)  # noqa: E731
    else:
        make = lambda device: MultiHeadLatentAttention(32, 2, None, 8, 4, 4, 4, rope_theta=5e5,  # noqa: E731
                                                       device=device)
    ref = make(None)
    mod = make("meta").to_empty(device="cpu")
    mod.load_state_dict(ref.state_dict())
    assert torch.equal(mod.rope_cos, ref.rope_cos) and torch.equal(mod.rope_sin, ref.rope_sin)
    exact_cos, exact_sin = cos_sin_formula(4096, 8 if kind == "gqa" else 4, 5e5)
    assert_table_from_formula(mod.rope_cos, exact_cos, "rope_cos")
    assert_table_from_formula(mod.rope_sin, exact_sin, "rope_sin")
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(mod(x), ref(x), rtol=0, atol=0)


def test_module_sizes_checked_before_use():
    with pytest.raises(ValueError, match=r"^num_heads must be an int >= 1, got 0$"):  # was a ZeroDivisionError
        GroupedQueryAttention(64, 0, 1)
    with pytest.raises(ValueError, match=r"^max_position_embeddings must be an int >= 1, got 0$"):
        GroupedQueryAttention(64, 4, 1, max_position_embeddings=0)


def test_paged_append_without_reserve_raises(device):
    mod = build("gqa", torch.float32, device)
    cache = make_cache("paged4", 1, 2, 8, mod, torch.float32, device)
    before = [t.clone() for t in cache.k + cache.v]
    with torch.no_grad(), pytest.raises(RuntimeError, match="slot_mapping"):
        mod(rand_x(2, 3, mod.hidden_size, torch.float32, device), cache=cache)
    assert cache.lengths().tolist() == [0, 0]
    assert all(torch.equal(a, b) for a, b in zip(before, cache.k + cache.v))
