"""attn_ops.nn.LinformerSelfAttention against a float64 reference in plain PyTorch math, every
sharing mode, GQA, shorter sequences, gradients, torch.compile and bad arguments."""
import math

import pytest
import torch

from attn_ops.nn import LinformerSelfAttention
from reference import assert_close_to_ref


def reference(m: LinformerSelfAttention, x: torch.Tensor) -> torch.Tensor:
    """Plain math, one head at a time: K'_h = E_h[:, :T] K_h, V'_h = F_h[:, :T] V_h, softmax(Q K'^T / sqrt(D)) V'."""
    B, T, _ = x.shape
    H, Hkv, D = m.num_heads, m.num_kv_heads, m.head_dim
    q = (x @ m.q_proj.weight.T + m.q_proj.bias).view(B, T, H, D)
    k = (x @ m.k_proj.weight.T + m.k_proj.bias).view(B, T, Hkv, D)
    v = (x @ m.v_proj.weight.T + m.v_proj.bias).view(B, T, Hkv, D)
    e = m.e_proj
    f = m.e_proj if m.f_proj is None else m.f_proj
    heads = []
    for h in range(H):
        g = h // (H // Hkv)
        e_h = (e[g] if e.dim() == 3 else e)[:, :T]
        f_h = (f[g] if f.dim() == 3 else f)[:, :T]
        kp = e_h @ k[:, :, g]  # [B, P, D]
        vp = f_h @ v[:, :, g]
        p = torch.softmax(q[:, :, h] @ kp.transpose(1, 2) / math.sqrt(D), dim=-1)
        heads.append(p @ vp)
    out = torch.stack(heads, dim=2).reshape(B, T, H * D)
    return out @ m.o_proj.weight.T + m.o_proj.bias


@pytest.mark.parametrize("sharing", ["none", "headwise", "key_value", "layerwise"])
@pytest.mark.parametrize("num_heads, num_kv_heads", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("T", [1, 13, 32])
def test_matches_reference_float64(sharing, num_heads, num_kv_heads, T):
    m = LinformerSelfAttention(32, num_heads, 32, 8, num_kv_heads=num_kv_heads, sharing=sharing, dtype=torch.float64)
    x = torch.randn(2, T, 32, dtype=torch.float64)
    torch.testing.assert_close(m(x), reference(m, x), rtol=1e-10, atol=1e-10)


def test_parameters_per_sharing_mode():
    shapes = {s: {n: tuple(p.shape) for n, p in LinformerSelfAttention(16, 4, 20, 5, num_kv_heads=2, sharing=s)
                  .named_parameters() if n.endswith("_proj")} for s in ["none", "headwise", "key_value", "layerwise"]}
    assert shapes["none"] == {"e_proj": (2, 5, 20), "f_proj": (2, 5, 20)}
    assert shapes["headwise"] == {"e_proj": (5, 20), "f_proj": (5, 20)}
    assert shapes["key_value"] == {"e_proj": (5, 20)} == shapes["layerwise"]


def test_layerwise_sharing_is_one_parameter_across_layers():
    first = LinformerSelfAttention(16, 2, 24, 6, sharing="layerwise", dtype=torch.float64)
    second = LinformerSelfAttention(16, 2, 24, 6, sharing="layerwise", shared_projection=first.e_proj,
                                    dtype=torch.float64)
    model = torch.nn.Sequential(first, second)
    assert second.e_proj is first.e_proj
    assert sum(1 for n, _ in model.named_parameters() if n.endswith("e_proj")) == 1
    x = torch.randn(2, 24, 16, dtype=torch.float64)
    model(x).sum().backward()
    assert first.e_proj.grad is not None and first.e_proj.grad.abs().sum() > 0
    torch.testing.assert_close(model(x), reference(second, reference(first, x)), rtol=1e-10, atol=1e-10)


def test_shorter_sequence_equals_zero_padded_keys():
    """A length-T input uses E[:, :T]: the same K', V' as keys/values zero-padded to seq_len."""
    m = LinformerSelfAttention(16, 2, 20, 4, sharing="headwise", dtype=torch.float64)
    x = torch.randn(1, 7, 16, dtype=torch.float64)
    k = m.k_proj(x).view(1, 7, 2, 8)
    padded = torch.cat([k, torch.zeros(1, 13, 2, 8, dtype=torch.float64)], dim=1)
    torch.testing.assert_close(m._project(m.e_proj, k), torch.einsum("pt,bthd->bphd", m.e_proj, padded))


def test_gradients_match_reference():
    m = LinformerSelfAttention(16, 4, 12, 5, num_kv_heads=2, sharing="none", dtype=torch.float64)
    x = torch.randn(2, 10, 16, dtype=torch.float64, requires_grad=True)
    grads = torch.autograd.grad(m(x).square().sum(), [x, m.e_proj, m.f_proj, m.q_proj.weight])
    ref = torch.autograd.grad(reference(m, x).square().sum(), [x, m.e_proj, m.f_proj, m.q_proj.weight])
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-9)


def test_gradcheck():
    m = LinformerSelfAttention(8, 2, 6, 3, num_kv_heads=1, dtype=torch.float64)
    x = torch.randn(1, 5, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(m, (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_within_rule(dtype):
    """The tolerance rule (reference.assert_close_to_ref) against the same-dtype plain math; float16 beside
    bfloat16, whose error at these output sizes hid a 3% error in the attention."""
    m64 = LinformerSelfAttention(32, 4, 64, 16, num_kv_heads=2, dtype=torch.float64)
    x64 = torch.randn(2, 50, 32, dtype=torch.float64)
    ref = reference(m64, x64)
    m = LinformerSelfAttention(32, 4, 64, 16, num_kv_heads=2, dtype=dtype)
    m.load_state_dict(m64.state_dict())
    x = x64.to(dtype)
    ours = m(x)
    same = reference(m, x)
    assert_close_to_ref(ours, ref, same.to(dtype), name="out")


def test_compile_fullgraph_dynamic():
    m = LinformerSelfAttention(32, 4, 64, 8, num_kv_heads=2, sharing="headwise")
    compiled = torch.compile(m, fullgraph=True, dynamic=True, backend="aot_eager")
    for T in (17, 40):
        x = torch.randn(2, T, 32, requires_grad=True)
        out = compiled(x)
        torch.testing.assert_close(out, m(x), rtol=1e-5, atol=1e-5)
        out.sum().backward()
        assert x.grad is not None


def test_shared_projection_must_be_a_parameter():
    """A plain tensor was stored as an attribute: not trained, not saved, not moved by .to()."""
    with pytest.raises(TypeError, match=r"^LinformerSelfAttention: shared_projection must be an nn.Parameter \(the "
                                        r"first layer's e_proj\), got Tensor$"):
        LinformerSelfAttention(32, 4, 16, 4, sharing="layerwise", shared_projection=torch.zeros(4, 16))


@pytest.mark.parametrize("kwargs, message", [
    ({"hidden_size": 30}, "LinformerSelfAttention: hidden_size expected a multiple of num_heads (4), got 30"),
    ({"num_kv_heads": 3}, "LinformerSelfAttention: num_kv_heads expected a divisor of num_heads (4), got 3"),
    ({"proj_len": 0}, "LinformerSelfAttention: seq_len and proj_len expected >= 1, got seq_len=16, proj_len=0"),
    ({"sharing": "all"},
     "LinformerSelfAttention: sharing expected one of ('none', 'headwise', 'key_value', 'layerwise'), got 'all'"),
    ({"shared_projection": torch.nn.Parameter(torch.zeros(4, 16))},
     "LinformerSelfAttention: shared_projection expected only with sharing='layerwise', got sharing='none'"),
    ({"sharing": "layerwise", "shared_projection": torch.nn.Parameter(torch.zeros(4, 8))},
     "LinformerSelfAttention: shared_projection expected shape (4, 16) [proj_len, seq_len], got (4, 8)"),
])
def test_bad_constructor_arguments(kwargs, message):
    args = {"hidden_size": 32, "num_heads": 4, "seq_len": 16, "proj_len": 4, **kwargs}
    with pytest.raises(ValueError) as info:
        LinformerSelfAttention(args.pop("hidden_size"), args.pop("num_heads"), args.pop("seq_len"),
                               args.pop("proj_len"), **args)
    assert str(info.value) == message


@pytest.mark.parametrize("shape, message", [
    ((2, 17, 32), "LinformerSelfAttention: x expected at most seq_len=16 positions, got 17"),
    ((2, 8, 16), "LinformerSelfAttention: x expected shape [batch, seq_len, 32], got [2, 8, 16]"),
    ((8, 32), "LinformerSelfAttention: x expected shape [batch, seq_len, 32], got [8, 32]"),
])
def test_bad_forward_inputs(shape, message):
    m = LinformerSelfAttention(32, 4, 16, 4)
    with pytest.raises(ValueError) as info:
        m(torch.randn(shape))
    assert str(info.value) == message
