"""Tensor-parallel layers and attention modules (Megatron-LM style; docs/distributed.md).

The parallel types hold one rank's shard and do their own communication, so the single-process
modules (:class:`~attn_ops.nn.GroupedQueryAttention`, :class:`~attn_ops.nn.MultiHeadLatentAttention`)
know nothing about ranks:

* :class:`ColumnParallelLinear`: a slice of a layer's output features; with ``copy_input`` its input
  passes through :func:`~attn_ops.parallel.copy_to_ranks` (``f``: the gradient of a replicated
  input is summed over the ranks, each of which only covers its own features).
* :class:`RowParallelLinear`: a slice of a layer's input features; the partial products are summed
  over the ranks (``g``, one all-reduce) and the replicated bias is added once, after the sum.
* :class:`TensorParallelGroupedQueryAttention`, :class:`TensorParallelMultiHeadLatentAttention`: the
  attention modules with their heads sharded, built by :meth:`from_module` (what
  :func:`attn_ops.tensor_parallel` calls).
"""
from __future__ import annotations

import copy
import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn.attention import GroupedQueryAttention
from ..nn.mla import MultiHeadLatentAttention
from .collectives import copy_to_ranks, reduce_from_ranks

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "TensorParallelGroupedQueryAttention",
           "TensorParallelMultiHeadLatentAttention"]


def _parameter_like(layer_param: Tensor, value: Tensor) -> nn.Parameter:
    """A parameter holding a contiguous copy of ``value`` (a slice of ``layer_param``), same
    ``requires_grad``."""
    return nn.Parameter(value.detach().clone(memory_format=torch.contiguous_format),
                        requires_grad=layer_param.requires_grad)


class ColumnParallelLinear(nn.Linear):
    """Output features ``start .. start + n - 1`` of a linear layer (and their bias) on this rank.

    ``copy_input``: the input is replicated over ``group`` and feeds only this rank's features here,
    so its gradient is summed over the ranks (``f``); ``False`` where the caller already did that for
    an input shared by several layers."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, group, copy_input: bool,
                 device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.group, self.copy_input = group, copy_input

    @classmethod
    def shard(cls, layer: nn.Linear, start: int, n: int, group, *, copy_input: bool) -> "ColumnParallelLinear":
        """Copies of ``layer``'s rows ``start .. start + n - 1`` (``layer`` is left unchanged)."""
        out = cls(layer.in_features, n, layer.bias is not None, group=group, copy_input=copy_input,
                  device="meta")
        out.weight = _parameter_like(layer.weight, layer.weight[start:start + n])
        if layer.bias is not None:
            out.bias = _parameter_like(layer.bias, layer.bias[start:start + n])
        return out

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(copy_to_ranks(x, self.group) if self.copy_input else x)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", copy_input={self.copy_input}"


class RowParallelLinear(nn.Linear):
    """Input features ``start .. start + n - 1`` of a linear layer on this rank: each rank multiplies
    its slice, one all-reduce sums the partial products, and the (replicated) bias is added once."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, group, device=None,
                 dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.group = group

    @classmethod
    def shard(cls, layer: nn.Linear, start: int, n: int, group) -> "RowParallelLinear":
        """Copies of ``layer``'s columns ``start .. start + n - 1`` and of its whole bias."""
        out = cls(n, layer.out_features, layer.bias is not None, group=group, device="meta")
        out.weight = _parameter_like(layer.weight, layer.weight[:, start:start + n])
        if layer.bias is not None:
            out.bias = _parameter_like(layer.bias, layer.bias)
        return out

    def forward(self, x: Tensor) -> Tensor:
        out = reduce_from_ranks(F.linear(x, self.weight), self.group)
        return out if self.bias is None else out + self.bias


def _sum_over_replicas(grad: Tensor, group, slot: int, slots: int) -> Tensor:
    """The sum of ``grad`` over the ranks holding the same KV head ``slot`` (of ``slots``): one
    all-reduce over ``group`` of a buffer where each rank fills its head's slot."""
    buf = grad.new_zeros(slots, *grad.shape)
    buf[slot] = grad
    dist.all_reduce(buf, group=group)
    return buf[slot]


class TensorParallelGroupedQueryAttention(GroupedQueryAttention):
    """One rank's shard of a :class:`~attn_ops.nn.GroupedQueryAttention`: column-parallel
    ``q_proj`` / ``k_proj`` / ``v_proj`` (this rank's heads), row-parallel ``o_proj``. The input is
    copied to the ranks once for the three projections. Made by :meth:`from_module`."""

    @classmethod
    def from_module(cls, module: GroupedQueryAttention, rank: int, world: int,
                    group) -> "TensorParallelGroupedQueryAttention":
        """Rank ``rank`` of ``world``'s shard of ``module`` (copies of its heads' weights; see
        :func:`attn_ops.tensor_parallel` for the split and its checks)."""
        Hq, Hkv, D = module.num_heads, module.num_kv_heads, module.head_dim
        if Hkv % world == 0:
            kv_local, kv_start, replicated = Hkv // world, rank * (Hkv // world), False
        elif world % Hkv == 0:
            kv_local, kv_start, replicated = 1, rank // (world // Hkv), True
        else:
            raise ValueError(f"tensor_parallel: num_kv_heads ({Hkv}) must be divisible by the world size "
                             f"of the group ({world}), or divide it (each KV head is then replicated on "
                             f"world_size / num_kv_heads ranks)")
        q_local = Hq // world
        local = cls(module.hidden_size, q_local, kv_local, D, rope_theta=module.rope_theta,
                    sliding_window=module.sliding_window, rope_interleaved=module.rope_interleaved,
                    max_position_embeddings=module.max_position_embeddings, device="meta",
                    dtype=module.q_proj.weight.dtype, softmax_scale=module.softmax_scale,
                    attention_chunk=module.attention_chunk, alibi=module.alibi)
        local._alibi_heads = (module._alibi_heads[0], module._alibi_heads[1] + rank * q_local)  # its heads' slopes
        if module.sinks is not None:  # this rank's heads' sinks (a copy, as the weights)
            local.sinks = torch.nn.Parameter(module.sinks.detach()[rank * q_local:(rank + 1) * q_local].clone())
        local.group = group
        column = functools.partial(ColumnParallelLinear.shard, group=group, copy_input=False)
        local.q_proj = column(module.q_proj, rank * q_local * D, q_local * D)
        local.k_proj = column(module.k_proj, kv_start * D, kv_local * D)
        local.v_proj = column(module.v_proj, kv_start * D, kv_local * D)
        local.o_proj = RowParallelLinear.shard(module.o_proj, rank * q_local * D, q_local * D, group)
        if replicated:
            hook = functools.partial(_sum_over_replicas, group=group, slot=kv_start, slots=Hkv)
            for p in (*local.k_proj.parameters(), *local.v_proj.parameters()):
                if p.requires_grad:
                    p.register_hook(hook)
        local.rope_cos, local.rope_sin = module.rope_cos, module.rope_sin  # the module's tables
        return local

    def forward(self, x: Tensor, *args, **kwargs) -> Tensor:
        """:meth:`GroupedQueryAttention.forward` on this rank's heads; the output is the full one."""
        # x feeds q/k/v of this rank's heads only: f sums its gradient over the ranks, once for all three
        return super().forward(copy_to_ranks(x, self.group), *args, **kwargs)


class TensorParallelMultiHeadLatentAttention(MultiHeadLatentAttention):
    """One rank's shard of a :class:`~attn_ops.nn.MultiHeadLatentAttention`: column-parallel
    ``q_b_proj`` (or ``q_proj``) and ``kv_b_proj`` (this rank's heads), row-parallel ``o_proj``;
    ``q_a_proj``, ``kv_a_proj_with_mqa`` and the two norms replicated. The latent ``c_kv`` and the
    rotary key ``k_pe`` feed this rank's heads only, so their gradients are summed over the ranks. The
    latent cache is replicated. Made by :meth:`from_module`."""

    @classmethod
    def from_module(cls, module: MultiHeadLatentAttention, rank: int, world: int,
                    group) -> "TensorParallelMultiHeadLatentAttention":
        """Rank ``rank`` of ``world``'s shard of ``module`` (copies of its heads' weights)."""
        H = module.num_heads // world
        local = cls(module.hidden_size, H, module.q_lora_rank, module.kv_lora_rank, module.qk_nope_head_dim,
                    module.qk_rope_head_dim, module.v_head_dim, rope_theta=module.rope_theta,
                    max_position_embeddings=module.max_position_embeddings,
                    softmax_scale=module.softmax_scale, attention_bias=module.o_proj.bias is not None,
                    rms_norm_eps=module.kv_a_layernorm.variance_epsilon, device="meta",
                    dtype=module.o_proj.weight.dtype)
        local.group = group
        qk, kv = module.qk_head_dim, module.qk_nope_head_dim + module.v_head_dim
        if module.q_lora_rank is None:
            local.q_proj = ColumnParallelLinear.shard(module.q_proj, rank * H * qk, H * qk, group,
                                                      copy_input=True)
        else:
            local.q_a_proj = copy.deepcopy(module.q_a_proj)
            local.q_a_layernorm = copy.deepcopy(module.q_a_layernorm)
            local.q_b_proj = ColumnParallelLinear.shard(module.q_b_proj, rank * H * qk, H * qk, group,
                                                        copy_input=True)
        local.kv_a_proj_with_mqa = copy.deepcopy(module.kv_a_proj_with_mqa)
        local.kv_a_layernorm = copy.deepcopy(module.kv_a_layernorm)
        # c_kv is copied to the ranks by _latent (it also feeds the cache and the absorbed path)
        local.kv_b_proj = ColumnParallelLinear.shard(module.kv_b_proj, rank * H * kv, H * kv, group,
                                                     copy_input=False)
        local.o_proj = RowParallelLinear.shard(module.o_proj, rank * H * module.v_head_dim,
                                               H * module.v_head_dim, group)
        local.rope_cos, local.rope_sin = module.rope_cos, module.rope_sin  # the module's tables (e.g. YaRN)
        return local

    def _latent(self, x: Tensor):
        c_kv, k_pe = super()._latent(x)
        return copy_to_ranks(c_kv, self.group), copy_to_ranks(k_pe, self.group)
