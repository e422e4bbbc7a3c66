"""attn_ops.nn.MultiHeadLatentAttention (DeepSeek-V2/V3 MLA) and the latent caches.

* against a plain-PyTorch transcription of HuggingFace's DeepseekV3Attention (rope_interleave=True)
  loaded with the module's state_dict: forward (q_lora_rank set and None, bias, custom scale, the
  192 / 128 DeepSeek-V3 head dims) and backward;
* the absorbed cached path (LatentKVCache, PagedLatentKVCache with block sizes 1 and 64): prefill then
  token-by-token decode equals the full-sequence (expanded) forward at every position;
* what the cache holds ([c_kv ; k_pe] per token and layer) and its size against a full K/V cache;
* the absorbed weights are made once per weight version and refresh after an optimizer step,
  load_state_dict and a dtype change;
* torch.compile(fullgraph=True) of a cached decode step.

Tolerance for the reference comparisons: reference.assert_close_to_ref (|ours - ref64| <=
2 * |same_dtype - ref64| + eps), ref64 the reference in float64, same_dtype the reference in the
module's dtype (HF eager: RoPE tables cast to the dtype, RMSNorm and softmax in float32). The
reference's rotary tables come from the configuration (rope_reference's formula), never from the
module's own rope_cos / rope_sin, which would hide a wrong theta.
"""

import math

import pytest
import torch
import torch.nn as nn

from attn_ops.nn import (KVCache, LatentKVCache, MultiHeadLatentAttention, OutOfBlocksError,
                         PagedLatentKVCache)
from reference import assert_close_to_ref
from rope_reference import assert_table_from_formula, cos_sin_formula, rope_ref
from model_helpers import (cache_factory, cached_step, check_paged_equals_contiguous,
                           check_prefill_then_decode, check_ragged_prompts_right_padded, default_positions,
                           make_cache_of, rand_x, randomize_vectors, rotate_half, stack_of)

F32_F64 = [torch.float32, torch.float64]
F32_F64_IDS = ["f32", "f64"]


# --------------------------------------------------------------------------------------------------
# Plain-PyTorch reference: HuggingFace DeepseekV3Attention (eager), written out
# --------------------------------------------------------------------------------------------------
class RefRMSNorm(nn.Module):
    """DeepseekV3RMSNorm (float32 math; float64 stays float64 so that ref64 is the ground truth)."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        h = x.to(torch.promote_types(x.dtype, torch.float32))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class RefMLA(nn.Module):
    def __init__(self, hidden, H, q_lora, kv_lora, nope, rope, v, bias, scale, eps):
        super().__init__()
        self.H, self.q_lora, self.kv_lora, self.nope, self.rope, self.v = H, q_lora, kv_lora, nope, rope, v
        self.scale = scale
        qk = nope + rope
        if q_lora is None:
            self.q_proj = nn.Linear(hidden, H * qk, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden, q_lora, bias=bias)
            self.q_a_layernorm = RefRMSNorm(q_lora, eps)
            self.q_b_proj = nn.Linear(q_lora, H * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, kv_lora + rope, bias=bias)
        self.kv_a_layernorm = RefRMSNorm(kv_lora, eps)
        self.kv_b_proj = nn.Linear(kv_lora, H * (nope + v), bias=False)
        self.o_proj = nn.Linear(H * v, hidden, bias=bias)

    @classmethod
    def like(cls, mod, dtype):
        ref = cls(mod.hidden_size, mod.num_heads, mod.q_lora_rank, mod.kv_lora_rank,
                  mod.qk_nope_head_dim, mod.qk_rope_head_dim, mod.v_head_dim,
                  mod.o_proj.bias is not None, mod.softmax_scale, mod.kv_a_layernorm.variance_epsilon)
        ref = ref.to(device=mod.o_proj.weight.device, dtype=dtype)
        ref.load_state_dict(mod.state_dict())  # strict: the same names and shapes; cast to dtype
        return ref

    def forward(self, x, cos_table, sin_table, positions):
        B, T, _ = x.shape
        H, nope, rope, dv = self.H, self.nope, self.rope, self.v
        if self.q_lora is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(B, T, H, nope + rope).transpose(1, 2)                       # [B, H, T, qk]
        q_pass, q_rot = torch.split(q, [nope, rope], dim=-1)
        compressed = self.kv_a_proj_with_mqa(x)
        k_pass, k_rot = torch.split(compressed, [self.kv_lora, rope], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(k_pass)).view(B, T, H, nope + dv).transpose(1, 2)
        k_pass, value = torch.split(kv, [nope, dv], dim=-1)
        k_rot = k_rot.view(B, 1, T, rope)
        # DeepseekV3RotaryEmbedding: emb = cat(freqs, freqs), cos/sin cast to the input dtype
        c, s = cos_table[positions], sin_table[positions]                      # [B, T, rope / 2]
        cos = torch.cat((c, c), -1).unsqueeze(1).to(x.dtype)
        sin = torch.cat((s, s), -1).unsqueeze(1).to(x.dtype)

        # apply_rotary_pos_emb_interleave: de-interleave, then rotate_half
        def deinterleave(t):
            b, h, n, d = t.shape
            return t.view(b, h, n, d // 2, 2).transpose(4, 3).reshape(b, h, n, d)

        q_rot, k_rot = deinterleave(q_rot), deinterleave(k_rot)
        q_rot = q_rot * cos + rotate_half(q_rot) * sin
        k_rot = k_rot * cos + rotate_half(k_rot) * sin
        k_rot = k_rot.expand(*k_pass.shape[:-1], -1)
        query = torch.cat((q_pass, q_rot), dim=-1)
        key = torch.cat((k_pass, k_rot), dim=-1)
        scores = torch.matmul(query, key.transpose(2, 3)) * self.scale
        visible = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~visible, float("-inf"))
        p = torch.softmax(scores, dim=-1, dtype=torch.promote_types(x.dtype, torch.float32))
        out = torch.matmul(p.to(x.dtype), value).transpose(1, 2).reshape(B, T, H * dv)
        return self.o_proj(out)


def ref_forward(name, mod, x, positions, dtype):
    """RefMLA of `mod` in `dtype`, rotating with CONFIGS[name]'s tables."""
    cos, sin = config_tables(name, x.device)
    return RefMLA.like(mod, dtype)(x.to(dtype), cos, sin, positions)


def ref_stack_forward(name):
    """The reference of a Stack of CONFIGS[name] modules, as check_prefill_then_decode calls it."""
    def forward(stack, x, positions, dtype):
        x = x.to(dtype)
        for layer in stack.layers:
            x = x + ref_forward(name, layer, x, positions, dtype)
        return x
    return forward


# --------------------------------------------------------------------------------------------------
# Configurations
# --------------------------------------------------------------------------------------------------
CONFIGS = {
    "q_lora": dict(hidden_size=64, num_heads=4, q_lora_rank=24, kv_lora_rank=32,
                   qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16),
    "no_q_lora": dict(hidden_size=64, num_heads=4, q_lora_rank=None, kv_lora_rank=32,
                      qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12),
    "bias_scale": dict(hidden_size=48, num_heads=3, q_lora_rank=16, kv_lora_rank=24,
                       qk_nope_head_dim=8, qk_rope_head_dim=16, v_head_dim=8, attention_bias=True,
                       softmax_scale=0.3, rope_theta=1e6, rms_norm_eps=1e-5),
    # DeepSeek-V3's head dims (Dqk 192, Dv 128) at a small width
    "v3_heads": dict(hidden_size=64, num_heads=2, q_lora_rank=32, kv_lora_rank=64,
                     qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
}


def build(name, dtype, device, max_pos=256):
    mod = MultiHeadLatentAttention(max_position_embeddings=max_pos, **CONFIGS[name])
    return randomize_vectors(mod.to(device=device, dtype=dtype))


def config_tables(name, device, max_pos=256):
    """float64 cos / sin [max_pos, rope / 2] of CONFIGS[name] from its own qk_rope_head_dim and rope_theta
    (the constructor's default 10000 when absent): independent of the module."""
    cfg = CONFIGS[name]
    cos, sin = cos_sin_formula(max_pos, cfg["qk_rope_head_dim"], cfg.get("rope_theta", 10000.0))
    return cos.to(device), sin.to(device)


def make_cache(kind, num_layers, B, capacity, mod, dtype, device, spare_blocks=3):
    dc, rope, kw = mod.kv_lora_rank, mod.qk_rope_head_dim, dict(dtype=dtype, device=device)
    return make_cache_of(kind, B, capacity, lambda cap: LatentKVCache(num_layers, B, cap, dc, rope, **kw),
                         lambda nb, bs, mb: PagedLatentKVCache(num_layers, nb, bs, dc, rope, B, mb, **kw),
                         spare_blocks)


# --------------------------------------------------------------------------------------------------
# Module structure
# --------------------------------------------------------------------------------------------------
def test_module_structure(device):
    m = MultiHeadLatentAttention(64, 4, 24, 32, 16, 8, 12, attention_bias=True, rope_theta=1e6, device=device)
    shapes = {n: tuple(p.shape) for n, p in m.named_parameters()}
    assert shapes == {
        "q_a_proj.weight": (24, 64), "q_a_proj.bias": (24,), "q_a_layernorm.weight": (24,),
        "q_b_proj.weight": (4 * 24, 24),
        "kv_a_proj_with_mqa.weight": (32 + 8, 64), "kv_a_proj_with_mqa.bias": (40,),
        "kv_a_layernorm.weight": (32,), "kv_b_proj.weight": (4 * (16 + 12), 32),
        "o_proj.weight": (64, 4 * 12), "o_proj.bias": (64,)}
    assert set(m.state_dict()) == set(shapes)            # rotary tables are non-persistent
    assert m.softmax_scale == pytest.approx(1 / math.sqrt(24))
    assert m.rope_cos.shape == (4096, 4) and m.rope_cos.dtype == torch.float32
    exact_cos, exact_sin = cos_sin_formula(4096, 8, 1e6)
    assert_table_from_formula(m.rope_cos, exact_cos, "rope_cos")
    assert_table_from_formula(m.rope_sin, exact_sin, "rope_sin")
    cos = m.rope_cos.clone()
    m = m.to(torch.bfloat16)
    assert m.kv_b_proj.weight.dtype == torch.bfloat16 and m.rope_cos.dtype == torch.float32
    assert torch.equal(m.rope_cos, cos)
    m = MultiHeadLatentAttention(64, 4, None, 32, 16, 8, 16, softmax_scale=0.5, device=device)
    assert {n: tuple(p.shape) for n, p in m.named_parameters()} == {
        "q_proj.weight": (4 * 24, 64), "kv_a_proj_with_mqa.weight": (40, 64),
        "kv_a_layernorm.weight": (32,), "kv_b_proj.weight": (4 * 32, 32), "o_proj.weight": (64, 64)}
    assert m.softmax_scale == 0.5
    with pytest.raises(ValueError, match="qk_rope_head_dim must be even"):
        MultiHeadLatentAttention(64, 4, None, 32, 16, 7, 16)


def test_wrong_cache_type(device):
    mod = build("q_lora", torch.float32, device)
    cache = KVCache(1, 2, 8, 4, 24, dtype=torch.float32, device=device)
    with torch.no_grad(), pytest.raises(TypeError, match="needs a LatentKVCache"):
        mod(rand_x(2, 3, 64, torch.float32, device), cache=cache)


# --------------------------------------------------------------------------------------------------
# (a) Forward against the reference; (c) backward
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", F32_F64 + [torch.bfloat16, torch.float16], ids=F32_F64_IDS + ["bf16", "f16"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward_matches_reference(name, dtype, device):
    mod = build(name, dtype, device)
    B, T = 2, 19
    x = rand_x(B, T, mod.hidden_size, dtype, device)
    pos = default_positions(B, T, device)
    with torch.no_grad():
        out = mod(x)
        ref64 = ref_forward(name, mod, x, pos, torch.float64)
        same = ref_forward(name, mod, x, pos, dtype)
    assert out.shape == (B, T, mod.hidden_size) and out.dtype == dtype
    assert_close_to_ref(out, ref64, same, name="out")


def test_explicit_positions(device):
    """positions [B, T] (per row) and [T] (shared) rotate at those positions."""
    dtype = torch.float32
    mod = build("bias_scale", dtype, device)
    B, T = 3, 11
    x = rand_x(B, T, mod.hidden_size, dtype, device)
    pos2d = torch.stack([torch.randperm(200, device=device)[:T] for _ in range(B)])
    pos1d = torch.arange(T, device=device) + 37
    for pos in (pos2d, pos1d):
        posb = pos.expand(B, T)
        with torch.no_grad():
            out = mod(x, positions=pos)
            ref64 = ref_forward("bias_scale", mod, x, posb, torch.float64)
            same = ref_forward("bias_scale", mod, x, posb, dtype)
        assert_close_to_ref(out, ref64, same, name="out")


def test_rope_tables(device):
    """rope_tables (cos, sin) [N, rope / 2] of _forward_with_tables (the adapters' entry) replace the
    module's tables and positions index their rows (e.g. per-token angles from HuggingFace, an
    attention factor multiplied in), uncached and cached."""
    dtype = torch.float32
    mod = build("q_lora", dtype, device)
    B, T, half = 2, 7, mod.qk_rope_head_dim // 2
    x = rand_x(B, T, mod.hidden_size, dtype, device)
    angles = 50 * torch.rand(B * T, half, dtype=torch.float64, device=device)
    cos, sin = 0.9 * angles.cos(), 0.9 * angles.sin()
    pos = torch.arange(B * T, device=device).view(B, T)
    tables = (cos.float(), sin.float())
    cache = LatentKVCache(1, B, T, mod.kv_lora_rank, mod.qk_rope_head_dim, dtype=dtype, device=device)
    with torch.no_grad():
        ref64 = RefMLA.like(mod, torch.float64)(x.double(), cos, sin, pos)
        same = RefMLA.like(mod, dtype)(x, cos.to(dtype), sin.to(dtype), pos)
        uncached = mod._forward_with_tables(x, pos, None, 0, tables)
        cached = mod._forward_with_tables(x, pos, cache, 0, tables)
    assert_close_to_ref(uncached, ref64, same, name="uncached")
    assert_close_to_ref(cached, ref64, same, name="cached")
    with pytest.raises(ValueError, match="positions must be given with rope_tables"):
        mod._forward_with_tables(x, None, None, 0, tables)


@pytest.mark.parametrize("dtype", F32_F64 + [torch.float16], ids=F32_F64_IDS + ["f16"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_backward_matches_reference(name, dtype, device):
    mod = build(name, dtype, device)
    B, T = 2, 17
    x0 = rand_x(B, T, mod.hidden_size, dtype, device)
    w = torch.randn(B, T, mod.hidden_size, device=device, dtype=dtype)
    pos = default_positions(B, T, device)

    def grads(fn, params, xdt):
        x = x0.detach().to(xdt).clone().requires_grad_()
        (fn(x) * w.to(xdt)).sum().backward()
        return {"x": x.grad, **{n: p.grad for n, p in params}}

    ours = grads(mod, list(mod.named_parameters()), dtype)
    cos, sin = config_tables(name, device)
    r64 = RefMLA.like(mod, torch.float64)
    g64 = grads(lambda x: r64(x, cos, sin, pos), list(r64.named_parameters()), torch.float64)
    rs = RefMLA.like(mod, dtype)
    gs = grads(lambda x: rs(x, cos, sin, pos), list(rs.named_parameters()), dtype)
    assert set(ours) == set(g64)
    for n in ours:
        assert ours[n] is not None, n
        assert_close_to_ref(ours[n], g64[n], gs[n], name=f"grad {n}")


# --------------------------------------------------------------------------------------------------
# (b) Absorbed cached path == expanded full-sequence path
# --------------------------------------------------------------------------------------------------
CACHE_KINDS = ["contig", "paged1", "paged64"]
CACHED_TOL = {torch.float32: 5e-5, torch.float64: 1e-10}


@pytest.mark.parametrize("dtype", F32_F64, ids=F32_F64_IDS)
@pytest.mark.parametrize("name", ["q_lora", "bias_scale"])
@pytest.mark.parametrize("kind", CACHE_KINDS)
def test_prefill_then_decode_matches_full_forward(kind, name, dtype, device):
    """model_helpers.check_prefill_then_decode through a 2-layer stack sharing one latent cache."""
    stack = stack_of(build, name, dtype, device)
    check_prefill_then_decode(stack, cache_factory(make_cache, stack, dtype, device, kind), ref_stack_forward(name),
                              dtype, device, CACHED_TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("name", ["q_lora", "bias_scale"])
@pytest.mark.parametrize("kind", CACHE_KINDS)
def test_cached_low_precision_matches_reference(kind, name, dtype, device):
    """The absorbed cached path in bfloat16 / float16: one layer (a stack's residual would hide its error at
    these precisions) prefilled in two chunks, then decoded token by token, against the float64 reference
    by the tolerance rule."""
    mod = build(name, dtype, device)
    B, chunks = 3, [8, 5, 1, 1, 1, 1, 1]
    T = sum(chunks)
    x = rand_x(B, T, mod.hidden_size, dtype, device)
    pos = default_positions(B, T, device)
    cache = make_cache(kind, 1, B, T + 3, mod, dtype, device)
    outs, s = [], 0
    with torch.no_grad():
        for n in chunks:
            outs.append(cached_step(mod, x[:, s:s + n], cache))
            s += n
        ref64 = ref_forward(name, mod, x, pos, torch.float64)
        same = ref_forward(name, mod, x, pos, dtype)
    assert_close_to_ref(torch.cat(outs, dim=1), ref64, same, name="cached")


def test_v3_head_dims_cached(device):
    """The absorbed path at DeepSeek-V3's head dims (nope 128, rope 64, v 128)."""
    dtype = torch.float32
    mod = build("v3_heads", dtype, device)
    B, P, n_dec = 2, 9, 4
    x = rand_x(B, P + n_dec, mod.hidden_size, dtype, device)
    cache = make_cache("contig", 1, B, P + n_dec, mod, dtype, device)
    with torch.no_grad():
        full = mod(x)
        outs = [cached_step(mod, x[:, :P], cache)]
        outs += [cached_step(mod, x[:, t:t + 1], cache) for t in range(P, P + n_dec)]
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=5e-5, atol=5e-5)


@pytest.mark.parametrize("kind", ["contig", "paged4"])
def test_ragged_prompts_right_padded(kind, device):
    stack = stack_of(build, "q_lora", torch.float32, device)
    check_ragged_prompts_right_padded(stack, cache_factory(make_cache, stack, torch.float32, device, kind),
                                      torch.float32, device, tol=5e-5)


@pytest.mark.parametrize("block_size", [1, 64])
def test_paged_equals_contiguous(block_size, device):
    stack = stack_of(build, "q_lora", torch.float32, device)
    check_paged_equals_contiguous(stack, cache_factory(make_cache, stack, torch.float32, device), block_size,
                                  lambda cache, layer: (cache.latent[layer],), device)


# --------------------------------------------------------------------------------------------------
# (d) What the cache holds, and its size
# --------------------------------------------------------------------------------------------------
def test_cache_holds_latent_rows(device):
    """Per token and layer the cache holds kv_lora_rank + rope_dim values: [RMSNorm(c_kv) ; RoPE(k_pe)]
    (shared by all heads), against num_heads * (nope + rope + v) for a full K/V cache."""
    dtype = torch.float32
    mod = build("q_lora", dtype, device)
    H, nope, rope, dv, dc = 4, 16, 8, 16, 32
    B, T, cap, L = 2, 7, 10, 3
    cache = LatentKVCache(L, B, cap, dc, rope, dtype=dtype, device=device)
    assert [tuple(t.shape) for t in cache.latent] == [(B, cap, dc + rope)] * L
    assert cache.kv_lora_rank == dc and cache.rope_dim == rope
    assert cache.bytes_per_token == L * (dc + rope) * 4
    assert cache.nbytes == L * B * cap * (dc + rope) * 4
    full = KVCache(L, B, cap, H, nope + rope, head_dim_v=dv, dtype=dtype, device=device)
    assert full.bytes_per_token == L * H * (nope + rope + dv) * 4
    assert full.bytes_per_token / cache.bytes_per_token == H * (nope + rope + dv) / (dc + rope)

    x = rand_x(B, T, mod.hidden_size, dtype, device)
    with torch.no_grad():
        mod(x, cache=cache, layer_idx=1)
        compressed = mod.kv_a_proj_with_mqa(x)
        c_kv = mod.kv_a_layernorm(compressed[..., :dc])
        k_pe = rope_ref(compressed[..., dc:].unsqueeze(2), *config_tables("q_lora", device),
                        default_positions(B, T, device), interleaved=True)[:, :, 0]
    assert cache.lengths().tolist() == [0, 0]                 # layer 1 of 3: not the last one
    torch.testing.assert_close(cache.latent[1][:, :T, :dc], c_kv, rtol=0, atol=0)
    torch.testing.assert_close(cache.latent[1][:, :T, dc:], k_pe.float(), rtol=1e-6, atol=1e-6)
    assert not cache.latent[0].any() and not cache.latent[1][:, T:].any()

    # DeepSeek-V3 (61 layers, 128 heads, d_c 512, rope 64, nope 128, v 128) in bfloat16, on meta
    v3 = LatentKVCache(61, 1, 1, 512, 64, dtype=torch.bfloat16, device="meta")
    v3_full = KVCache(61, 1, 1, 128, 192, head_dim_v=128, dtype=torch.bfloat16, device="meta")
    assert v3.bytes_per_token == 61 * 576 * 2
    assert v3_full.bytes_per_token == 61 * 128 * 320 * 2
    assert v3_full.bytes_per_token / v3.bytes_per_token == pytest.approx(40960 / 576)


def test_paged_latent_allocator(device):
    c = PagedLatentKVCache(2, 6, 4, 32, 8, 2, 3, device=device)
    assert c.capacity == 12 and c.num_free_blocks == 6 and c.batch_size == 2
    assert [tuple(t.shape) for t in c.latent] == [(6, 4, 40)] * 2
    assert c.nbytes == 2 * 6 * 4 * 40 * 4 and c.bytes_per_token == 2 * 40 * 4
    assert c.reserve(5) == 4
    assert c.row_blocks(0) == [0, 2] and c.row_blocks(1) == [1, 3]
    assert c.block_table.tolist() == [[0, 2, 6], [1, 3, 6]]
    c.advance(5)
    with pytest.raises(RuntimeError, match=r"PagedLatentKVCache.reserve: row 1 would hold 13 tokens"):
        c.reserve([0, 8])
    c.truncate([3, 5])
    assert c.row_blocks(0) == [0] and c.num_free_blocks == 3
    c.free_rows([1])
    assert c.lengths().tolist() == [3, 0] and c.num_free_blocks == 5
    c.reset()
    assert c.num_free_blocks == 6 and c.block_table.tolist() == [[6, 6, 6], [6, 6, 6]]
    small = PagedLatentKVCache(1, 3, 4, 32, 8, 2, 3, device=device)
    with pytest.raises(OutOfBlocksError, match=r"PagedLatentKVCache.reserve: out of KV-cache blocks: "
                                               r"the next tokens need 4 more blocks of 4 tokens, 3 of 3"):
        small.reserve(5)
    assert small.num_free_blocks == 3 and small.row_blocks(0) == []


def test_paged_append_without_reserve_raises(device):
    mod = build("q_lora", torch.float32, device)
    cache = make_cache("paged4", 1, 2, 8, mod, torch.float32, device)
    with torch.no_grad(), pytest.raises(RuntimeError, match="slot_mapping"):
        mod(rand_x(2, 3, mod.hidden_size, torch.float32, device), cache=cache)
    assert cache.lengths().tolist() == [0, 0] and not cache.latent[0].any()


# --------------------------------------------------------------------------------------------------
# (e) Absorbed weights: once per weight version
# --------------------------------------------------------------------------------------------------
def split_kv_b(mod):
    w = mod.kv_b_proj.weight.detach().view(mod.num_heads, -1, mod.kv_lora_rank)
    return w[:, :mod.qk_nope_head_dim], w[:, mod.qk_nope_head_dim:].transpose(1, 2)


def assert_cached_equals_full(mod, x, kind="contig"):
    B, T = x.shape[:2]
    cache = make_cache(kind, 1, B, T, mod, mod.o_proj.weight.dtype, x.device)
    with torch.no_grad():
        full = mod(x)
        outs = [cached_step(mod, x[:, :T - 2], cache)]
        outs += [cached_step(mod, x[:, t:t + 1], cache) for t in (T - 2, T - 1)]
    tol = CACHED_TOL[x.dtype]
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=tol, atol=tol)


def test_absorbed_weights_made_under_inference_mode_not_reused_in_grad_mode():
    """Copies made under torch.inference_mode() are inference tensors; reused by a later cached step in grad mode
    they could not be saved for backward, and that step raised."""
    mod = build("q_lora", torch.float32, "cpu")
    x = rand_x(2, 3, mod.hidden_size, torch.float32, "cpu")
    with torch.inference_mode():
        cache = make_cache("contig", 2, 2, 16, mod, torch.float32, "cpu")
        made = mod(x, cache=cache)
    cache = make_cache("contig", 2, 2, 16, mod, torch.float32, "cpu")
    assert not mod.absorbed_weights()[0].is_inference()
    torch.testing.assert_close(mod(x, cache=cache), made, rtol=1e-6, atol=1e-6)


def test_cache_of_another_latent_split_is_refused():
    mod = MultiHeadLatentAttention(32, 2, None, 8, 4, 4, 4)
    cache = LatentKVCache(1, 2, 16, 6, 6)  # 12 values per token, as the module's 8 + 4, split otherwise
    with pytest.raises(ValueError, match=r"^MultiHeadLatentAttention: the cache holds kv_lora_rank 6 \+ rope_dim 6 "
                                         r"per token, this module kv_lora_rank 8 \+ qk_rope_head_dim 4$"):
        with torch.no_grad():
            mod(torch.randn(2, 1, 32), cache=cache)


def test_absorbed_weights_refresh(device):
    dtype = torch.float32
    mod = build("q_lora", dtype, device)
    x = rand_x(2, 9, mod.hidden_size, dtype, device)
    w_uk, w_uv = mod.absorbed_weights()
    ref_uk, ref_uv = split_kv_b(mod)
    assert torch.equal(w_uk, ref_uk) and torch.equal(w_uv, ref_uv)
    assert w_uk.is_contiguous() and w_uv.is_contiguous() and not w_uk.requires_grad
    assert_cached_equals_full(mod, x)
    again = mod.absorbed_weights()
    assert again[0] is w_uk and again[1] is w_uv          # reused across steps, not remade

    # an optimizer step (training path) changes kv_b_proj.weight in place
    opt = torch.optim.SGD(mod.parameters(), lr=0.5)
    mod(x).square().mean().backward()
    opt.step()
    new_uk, new_uv = mod.absorbed_weights()
    ref_uk, ref_uv = split_kv_b(mod)
    assert new_uk is not w_uk and not torch.equal(new_uk, w_uk)
    assert torch.equal(new_uk, ref_uk) and torch.equal(new_uv, ref_uv)
    assert_cached_equals_full(mod, x, kind="paged4")

    # load_state_dict
    other = build("q_lora", dtype, device)
    mod.load_state_dict(other.state_dict())
    assert torch.equal(mod.absorbed_weights()[0], split_kv_b(other)[0])
    assert_cached_equals_full(mod, x)

    # in-place update under no_grad, and a dtype change
    with torch.no_grad():
        mod.kv_b_proj.weight.mul_(1.5)
    assert torch.equal(mod.absorbed_weights()[1], split_kv_b(mod)[1])
    mod = mod.double()
    assert mod.absorbed_weights()[0].dtype == torch.float64
    assert_cached_equals_full(mod, x.double())


# --------------------------------------------------------------------------------------------------
# (f) torch.compile of a cached decode step
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("kind", ["contig", "paged64"])
def test_compiled_decode_step(kind, dynamic, device):
    """A decode step through a 2-layer stack (rotary in place, mla_cache_append, absorbed query,
    mla_decode, W_UV, advance) under torch.compile(fullgraph=True): no graph break, eager's results,
    the cache written in place, and the live weights used (no stale absorbed copy in the graph). With
    dynamic=True too (the rotary slices q[..., nope:] and k_pe must keep fixed offsets there: README)."""
    dtype = torch.float32
    stack = stack_of(build, "q_lora", dtype, device)
    E = stack.layers[0].hidden_size
    B, P = 2, 9
    ce, cc = (make_cache(kind, 2, B, 16, stack.layers[0], dtype, device) for _ in range(2))
    prompt = rand_x(B, P, E, dtype, device)
    with torch.no_grad():
        for c in (ce, cc):
            cached_step(stack, prompt, c)

    def step(x, cache):
        with torch.no_grad():
            return stack(x, cache=cache)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=dynamic)   # fullgraph: any graph break raises
    ptrs = [t.data_ptr() for t in cc.latent + [cc.seqlens]]
    for i in range(4):
        if i == 3:   # new weights, in place: same graph (no recompile), the new values used
            with torch.no_grad():
                for layer in stack.layers:
                    layer.kv_b_proj.weight.mul_(-0.75)
        if kind != "contig":
            ce.reserve(1)
            cc.reserve(1)
        x = rand_x(B, 1, E, dtype, device)
        before = [t.clone() for t in cc.latent]
        eo = step(x, ce)
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            co = compiled(x, cc)
        torch.testing.assert_close(co, eo, rtol=1e-5, atol=1e-5)
        assert [t.data_ptr() for t in cc.latent + [cc.seqlens]] == ptrs
        assert cc.lengths().tolist() == ce.lengths().tolist() == [P + i + 1] * B
        for tc, te, tb in zip(cc.latent, ce.latent, before):
            assert not torch.equal(tc, tb)            # the step wrote into the cache in place
            torch.testing.assert_close(tc, te, rtol=1e-5, atol=1e-5)
