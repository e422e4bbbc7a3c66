"""GroupedQueryAttention.from_linear: swapping a plain-PyTorch model's own attention module
(docs/module_swap.md).

A small transformer written without attn_ops (its attention: rotate_half RoPE, K/V heads repeated,
torch's scaled_dot_product_attention with is_causal) has every attention module replaced by
GroupedQueryAttention.from_linear over the module's own Linear layers (the docs' recipe). Checked: the
swapped model's logits and the gradients of every parameter against the original model (tolerance
rule: ref64 = the original in float64, same_dtype = the original in the test dtype), that the
parameters are the same objects (shared, not copied), and from_linear's input checks.
"""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attn_ops.nn import GroupedQueryAttention
from reference import assert_close_to_ref


# --------------------------------------------------------------------------------------------------
# A user's model, plain PyTorch
# --------------------------------------------------------------------------------------------------
def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class UserAttention(nn.Module):
    """Causal self-attention with RoPE (rotate_half) and grouped K/V heads repeated for SDPA."""

    def __init__(self, dim, n_heads, n_kv_heads, head_dim, qkv_bias, out_bias, theta):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim, self.theta = n_heads, n_kv_heads, head_dim, theta
        self.query = nn.Linear(dim, n_heads * head_dim, bias=qkv_bias)
        self.key = nn.Linear(dim, n_kv_heads * head_dim, bias=qkv_bias)
        self.value = nn.Linear(dim, n_kv_heads * head_dim, bias=qkv_bias)
        self.out = nn.Linear(n_heads * head_dim, dim, bias=out_bias)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.query(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.key(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.value(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        inv_freq = self.theta ** (-torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim)
        angles = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq
        cos = torch.cat((angles.cos(), angles.cos()), -1).to(x.dtype)
        sin = torch.cat((angles.sin(), angles.sin()), -1).to(x.dtype)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(o.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


class Block(nn.Module):
    def __init__(self, dim, **attn):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = UserAttention(dim, **attn)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab, dim, n_layers, **attn):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, **attn) for _ in range(n_layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def swap_attention(model):
    """The recipe of docs/module_swap.md: every UserAttention becomes a GroupedQueryAttention over
    the same Linear layers."""
    for name, module in list(model.named_modules()):
        if isinstance(module, UserAttention):
            parent, _, child = name.rpartition(".")
            new = GroupedQueryAttention.from_linear(
                module.query, module.key, module.value, module.out, num_heads=module.n_heads,
                num_kv_heads=module.n_kv_heads, head_dim=module.head_dim, rope_theta=module.theta)
            setattr(model.get_submodule(parent), child, new)
    return model


CONFIGS = {
    "gqa_biases": dict(n_heads=4, n_kv_heads=2, head_dim=8, qkv_bias=True, out_bias=True, theta=10000.0),
    "mqa": dict(n_heads=4, n_kv_heads=1, head_dim=8, qkv_bias=False, out_bias=False, theta=500.0),
    "mha_wide_heads": dict(n_heads=2, n_kv_heads=2, head_dim=24, qkv_bias=True, out_bias=False,
                           theta=1e6),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_swap_matches_original(config, dtype):
    vocab, dim = 50, 32
    model = TinyLM(vocab, dim, n_layers=2, **CONFIGS[config])
    with torch.no_grad():  # non-trivial norm weights and biases
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.3)
    ref64 = copy.deepcopy(model).double()
    same = copy.deepcopy(model).to(dtype)
    model = model.to(dtype)
    params = dict(model.named_parameters())
    attn0 = model.blocks[0].attn
    swap_attention(model)

    # shared, not copied: the same Parameter objects, now under the q/k/v/o_proj names
    assert isinstance(model.blocks[0].attn, GroupedQueryAttention)
    assert model.blocks[0].attn.q_proj is attn0.query and model.blocks[0].attn.o_proj is attn0.out
    assert {id(p) for p in model.parameters()} == {id(p) for p in params.values()}
    assert "blocks.1.attn.k_proj.weight" in dict(model.named_parameters())

    tokens = torch.randint(0, vocab, (2, 11))
    targets = torch.randint(0, vocab, (2, 11))
    logits = model(tokens)
    results = [(logits, params)]
    for m in (ref64, same):
        results.append((m(tokens), dict(m.named_parameters())))
    for out, _ in results:
        F.cross_entropy(out.flatten(0, 1).to(torch.float64), targets.flatten()).backward()
    (ours, ours_p), (r64, r64_p), (rs, rs_p) = results
    assert_close_to_ref(ours, r64, rs, name="logits")
    for name, p in ours_p.items():
        assert_close_to_ref(p.grad, r64_p[name].grad, rs_p[name].grad, name=f"grad {name}")


def _linears(E=32, H=4, Hkv=2, D=8, **kw):
    return [nn.Linear(E, H * D, **kw), nn.Linear(E, Hkv * D, **kw), nn.Linear(E, Hkv * D, **kw),
            nn.Linear(H * D, E, **kw)]


def _replace(i, layer):
    def make():
        layers = _linears()
        layers[i] = layer
        return layers
    return make


@pytest.mark.parametrize("make, kwargs, error, message", [
    (_replace(0, nn.Conv1d(32, 32, 1)), {}, TypeError, r"q_proj must be a torch.nn.Linear, got Conv1d"),
    (_replace(0, nn.Linear(32, 24)), {}, ValueError,
     r"q_proj must map hidden_size -> num_heads \* head_dim = 4 \* 8 \(hidden_size = q_proj.in_features = "
     r"32\): weight of shape \[32, 32\], got \[24, 32\]"),
    (_replace(1, nn.Linear(32, 8)), {}, ValueError,
     r"k_proj must map hidden_size -> num_kv_heads \* head_dim = 2 \* 8 \(hidden_size = q_proj.in_features "
     r"= 32\): weight of shape \[16, 32\], got \[8, 32\]"),
    (_replace(2, nn.Linear(30, 16)), {}, ValueError, r"v_proj must map .* weight of shape \[16, 32\], "
                                                     r"got \[16, 30\]"),
    (_replace(3, nn.Linear(32, 16)), {}, ValueError,
     r"o_proj must map num_heads \* head_dim = 4 \* 8 -> hidden_size .* weight of shape \[32, 32\], got "
     r"\[16, 32\]"),
    (_replace(1, nn.Linear(32, 16, dtype=torch.float64)), {}, ValueError,
     r"k_proj.weight must have the dtype and device of q_proj.weight \(torch.float32, cpu\), got "
     r"torch.float64, cpu"),
    (_linears, dict(num_kv_heads=3), ValueError, r"num_heads \(4\) must be a positive multiple of "
                                                 r"num_kv_heads \(3\)"),
    (_linears, dict(num_heads=5), ValueError, r"hidden_size \(32\) must be a multiple of num_heads \(5\)"),
], ids=["not_linear", "q_shape", "k_shape", "v_in_features", "o_shape", "dtype", "heads", "head_dim"])
def test_from_linear_errors(make, kwargs, error, message):
    args = dict(num_heads=4, num_kv_heads=2)
    args.update(kwargs)
    with pytest.raises(error, match="^" + message):
        GroupedQueryAttention.from_linear(*make(), **args)


def test_from_linear_default_head_dim_and_biases():
    """head_dim defaults to hidden_size // num_heads; q/k/v and o_proj biases are used as given."""
    layers = _linears(bias=True)
    mod = GroupedQueryAttention.from_linear(*layers, num_heads=4, num_kv_heads=2, sliding_window=3)
    assert (mod.hidden_size, mod.head_dim, mod.sliding_window) == (32, 8, 3)
    assert [mod.q_proj, mod.k_proj, mod.v_proj, mod.o_proj] == layers
    assert mod.rope_cos.shape == (4096, 4) and mod.rope_cos.dtype == torch.float32
    assert set(mod.state_dict()) == {f"{p}_proj.{w}" for p in "qkvo" for w in ("weight", "bias")}
