"""The tensor-parallel types of attn_ops.parallel in one process (a gloo group of one rank): what
tensor_parallel returns, its layer types, and that a shard of the whole group computes what the full
module does. The multi-rank behaviour (sharded heads, gradients) is tests/test_distributed.py's."""
import socket

import pytest
import torch
import torch.distributed as dist

import attn_ops
from attn_ops.nn import GroupedQueryAttention, MultiHeadLatentAttention
from attn_ops.parallel import (ColumnParallelLinear, RowParallelLinear, TensorParallelGroupedQueryAttention,
                               TensorParallelMultiHeadLatentAttention)
from model_helpers import randomize_vectors
from rope_reference import (assert_table_from_formula, cos_sin_formula, cos_sin_of, yarn_attention_factor,
                            yarn_inv_freq)

F64 = torch.float64


@pytest.fixture
def group():
    """A gloo process group of this process alone, destroyed after the test (other tests expect none)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def check_tables(local, exact_cos, exact_sin):
    """The shard's rotary tables are the formula's (matching the full module alone would let both share
    wrong ones)."""
    assert_table_from_formula(local.rope_cos, exact_cos, "shard rope_cos")
    assert_table_from_formula(local.rope_sin, exact_sin, "shard rope_sin")


def check_same(full, local, x):
    x_full, x_local = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_full, out_local = full(x_full), local(x_local)
    torch.testing.assert_close(out_local, out_full, rtol=1e-12, atol=1e-12)
    dy = torch.randn_like(out_full)
    out_full.backward(dy)
    out_local.backward(dy)
    torch.testing.assert_close(x_local.grad, x_full.grad, rtol=1e-12, atol=1e-12)
    for name, p in local.named_parameters():
        torch.testing.assert_close(p.grad, full.get_parameter(name).grad, rtol=1e-12, atol=1e-12)


def test_gqa_shard_types(group):
    full = randomize_vectors(GroupedQueryAttention(32, 4, 2, bias=True, softmax_scale=0.4, rope_theta=1e6,
                                                   dtype=F64))
    local = attn_ops.tensor_parallel(full)
    check_tables(local, *cos_sin_formula(4096, 8, 1e6))
    assert type(local) is TensorParallelGroupedQueryAttention and isinstance(local, GroupedQueryAttention)
    assert all(type(getattr(local, n)) is ColumnParallelLinear and not getattr(local, n).copy_input
               for n in ("q_proj", "k_proj", "v_proj"))
    assert type(local.o_proj) is RowParallelLinear and local.group is group
    assert local.softmax_scale == 0.4 and "copy_input=False" in repr(local.q_proj)
    check_same(full, local, torch.randn(2, 5, 32, dtype=F64))
    with pytest.raises(ValueError, match=r"^tensor_parallel: module is already a tensor-parallel shard \(a "
                                         r"TensorParallelGroupedQueryAttention\)"):
        attn_ops.tensor_parallel(local)


@pytest.mark.parametrize("q_lora_rank", [None, 8])
def test_mla_shard_types(group, q_lora_rank):
    """With YaRN tables (theta 1e6, factor 4 over 32 original positions, DeepSeek's attention factor) that
    the caller wrote into the full module: the shard must keep them, not rebuild the constructor's."""
    full = randomize_vectors(MultiHeadLatentAttention(32, 2, q_lora_rank, 8, 4, 4, 4, attention_bias=True,
                                                      rope_theta=1e6, dtype=F64))
    yarn = cos_sin_of(4096, yarn_inv_freq(4, 1e6, 4.0, 32), yarn_attention_factor(4.0, 1.0, 0.8))
    full.rope_cos, full.rope_sin = yarn
    local = attn_ops.tensor_parallel(full)
    check_tables(local, *yarn)
    assert type(local) is TensorParallelMultiHeadLatentAttention
    q = local.q_proj if q_lora_rank is None else local.q_b_proj
    assert type(q) is ColumnParallelLinear and q.copy_input
    assert type(local.kv_b_proj) is ColumnParallelLinear and not local.kv_b_proj.copy_input
    assert type(local.o_proj) is RowParallelLinear and type(local.kv_a_proj_with_mqa) is torch.nn.Linear
    check_same(full, local, torch.randn(2, 5, 32, dtype=F64))
