"""The old spellings of renamed constructor arguments and attributes keep working for one release,
each with a FutureWarning naming the new one; the new names give the same objects. Also: every
argument of every schema is reachable from its Python wrapper in attn_ops.ops."""
import inspect
import re

import pytest
import torch

import attn_ops
from attn_ops import ops
from attn_ops.nn import (GroupedQueryAttention, KVCache, LatentKVCache, LinformerSelfAttention,
                         MultiHeadAttention, MultiHeadLatentAttention, MultiQueryAttention, PagedKVCache,
                         PagedLatentKVCache)
from rope_reference import cos_sin_formula


def deprecated(old, new):
    """pytest.warns for the deprecation of ``old`` in favour of ``new``."""
    return pytest.warns(FutureWarning, match=rf"'{old}'.* is deprecated .* use '?{re.escape(new)}")


@pytest.mark.parametrize("cls, args", [
    (GroupedQueryAttention, dict(num_heads=4, num_kv_heads=2)),
    (MultiQueryAttention, dict(num_heads=4)),
    (MultiHeadAttention, dict(num_heads=4)),
    (LinformerSelfAttention, dict(num_heads=4, seq_len=8, proj_len=4)),
])
def test_embed_dim_is_hidden_size(cls, args):
    torch.manual_seed(0)
    new = cls(hidden_size=32, **args)
    torch.manual_seed(0)
    with deprecated("embed_dim", "hidden_size"):
        old = cls(embed_dim=32, **args)
    assert old.hidden_size == new.hidden_size == 32
    assert all(torch.equal(p, q) for p, q in zip(old.parameters(), new.parameters()))
    with deprecated("embed_dim", "hidden_size"):
        assert new.embed_dim == 32
    with pytest.raises(TypeError, match=r"got both 'embed_dim' \(deprecated\) and 'hidden_size'"):
        cls(hidden_size=32, embed_dim=32, **args)


@pytest.mark.parametrize("cls, args", [
    (PagedKVCache, dict(num_layers=1, num_blocks=4, block_size=2, num_kv_heads=2, head_dim=4,
                        max_blocks_per_seq=2)),
    (PagedLatentKVCache, dict(num_layers=1, num_blocks=4, block_size=2, kv_lora_rank=8, rope_dim=4,
                              max_blocks_per_seq=2)),
])
def test_max_batch_is_batch_size(cls, args):
    with deprecated("max_batch", "batch_size"):
        old = cls(max_batch=3, **args)
    new = cls(batch_size=3, **args)
    assert old.batch_size == new.batch_size == 3 and old.block_table.shape == new.block_table.shape
    with deprecated("max_batch", "batch_size"):
        assert new.max_batch == 3


@pytest.mark.parametrize("make", [
    lambda *dd: LatentKVCache(1, 2, 4, 8, 4, *dd),
    lambda *dd: PagedLatentKVCache(1, 4, 2, 8, 4, 2, 2, *dd),
], ids=["contiguous", "paged"])
def test_latent_cache_dtype_positional(make):
    with deprecated("dtype", "dtype=..."), deprecated("device", "device=..."):
        cache = make(torch.float64, "cpu")
    assert cache.latent[0].dtype == torch.float64 and cache.latent[0].device.type == "cpu"
    with deprecated("dtype", "dtype=..."):
        assert make(torch.float16).latent[0].dtype == torch.float16
    with pytest.raises(TypeError, match="takes at most"):
        make(torch.float64, "cpu", 1)


def test_keyword_calls_do_not_warn(recwarn):
    GroupedQueryAttention(32, 4, 2, softmax_scale=0.5)
    KVCache(1, 2, 4, 2, 4, dtype=torch.float64)
    PagedKVCache(1, 4, 2, 2, 4, 2, 2)
    LatentKVCache(1, 2, 4, 8, 4, dtype=torch.float64)
    PagedLatentKVCache(1, 4, 2, 8, 4, 2, 2, dtype=torch.float64)
    assert not [w for w in recwarn if issubclass(w.category, (FutureWarning, DeprecationWarning))]


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


def test_mla_rope_tables_argument():
    """forward(..., rope_tables=...) still works, warns, and equals _forward_with_tables."""
    torch.manual_seed(0)
    mod = MultiHeadLatentAttention(32, 2, None, 8, 4, 4, 4, dtype=torch.float64)
    x = torch.randn(2, 3, 32, dtype=torch.float64)
    angles = torch.rand(6, 2, dtype=torch.float64)
    tables, pos = (angles.cos(), angles.sin()), torch.arange(6).view(2, 3)
    with pytest.warns(FutureWarning, match="'rope_tables' is deprecated"):
        out = mod(x, pos, rope_tables=tables)
    torch.testing.assert_close(out, mod._forward_with_tables(x, pos, None, 0, tables), rtol=0, atol=0)
    # under torch.compile it does not warn (Dynamo cannot trace warnings.warn: fullgraph=True failed)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, pos: mod(x, pos, rope_tables=tables), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, pos), out, rtol=1e-12, atol=1e-12)


def _schema_arguments(name):
    return [a.name for a in getattr(torch.ops.attn_ops, name).default._schema.arguments]


# every public operator the library registered (torch.ops.attn_ops lists its ops only once they are used);
# names with a leading underscore are the library's test hooks (the CUDA build's _cuda_last_launch), not API
OPS = sorted({n.split("::")[1].split(".")[0] for n in torch._C._dispatch_get_all_op_names()
              if n.startswith("attn_ops::") and not n.startswith("attn_ops::_")})


def test_ops_are_listed():
    assert {"attention", "attention_backward", "mla_decode", "lightning_attention_decode_"} <= set(OPS)


@pytest.mark.parametrize("name", OPS)
def test_every_schema_argument_reachable_from_python(name):
    wrapper = getattr(ops, name, None)
    assert wrapper is not None, f"attn_ops.ops has no wrapper for torch.ops.attn_ops.{name}"
    params = inspect.signature(wrapper).parameters
    missing = [a for a in _schema_arguments(name) if a not in params]
    assert not missing, f"attn_ops.ops.{name} does not expose {missing}"
