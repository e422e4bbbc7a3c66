"""Multi-process attention with ``torch.distributed`` (docs/distributed.md).

* :func:`tensor_parallel`: a head-sharded copy of a :class:`~attn_ops.nn.GroupedQueryAttention` or
  :class:`~attn_ops.nn.MultiHeadLatentAttention` for this rank (Megatron-LM style: column-parallel
  q/k/v projections, row-parallel ``o_proj`` with one all-reduce), for training and cached inference.
* :func:`merge_attention_partials_across_ranks`: the exact attention output from partial results
  over disjoint key shards, each rank holding one shard's ``(out, lse)``; the single-process merge is
  :func:`attn_ops.merge_attention_partials` (``attn_ops/merge.py``, pure tensor math, differentiable),
  also importable from here.
"""
from __future__ import annotations

import copy
import functools
from typing import Tuple, Union

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .merge import check_partials, merge_attention_partials
from .nn import GroupedQueryAttention, MultiHeadLatentAttention
from .nn._collectives import gather_from_ranks

__all__ = ["tensor_parallel", "merge_attention_partials", "merge_attention_partials_across_ranks"]


# --------------------------------------------------------------------------------------------------
# Tensor parallel
# --------------------------------------------------------------------------------------------------
def tensor_parallel(module: Union[GroupedQueryAttention, MultiHeadLatentAttention],
                    group=None) -> Union[GroupedQueryAttention, MultiHeadLatentAttention]:
    """This rank's shard of ``module``: a new module of the same kind (a GQA/MQA/MHA module gives a
    :class:`~attn_ops.nn.GroupedQueryAttention`) holding copies of its heads' weights; ``module`` is
    left unchanged. Every rank of ``group`` (default: the world) calls it with the same full module.

    Rank ``r`` of ``W`` holds query heads ``r * H / W .. (r + 1) * H / W - 1`` (``num_heads`` must be
    divisible by ``W``): their rows of ``q_proj`` (MLA: ``q_b_proj`` or ``q_proj``, and ``kv_b_proj``)
    and their columns of ``o_proj``. GQA: the KV heads those query heads read -- ``num_kv_heads / W`` of
    them when ``W`` divides ``num_kv_heads``; when ``num_kv_heads < W`` and divides ``W``, one KV head,
    replicated on the ``W / num_kv_heads`` consecutive ranks that read it, whose ``k_proj`` / ``v_proj``
    gradients are summed over those ranks during backward (gradient hooks), so the copies stay equal.
    MLA: ``q_a_proj``, ``kv_a_proj_with_mqa`` and the two norms are replicated. Biases of sharded rows
    are sharded; the ``o_proj`` bias is replicated and added once, after the all-reduce.

    Forward takes the same (replicated) input on every rank and returns the full output on every rank
    (one all-reduce after ``o_proj``). Backward follows Megatron-LM: every rank computes the same
    loss; the gradients of the input and of replicated weights are summed over the ranks where they
    feed per-rank heads, so every parameter's gradient equals the single-process one (its slice, for
    sharded weights). Cached inference: a GQA rank's :class:`~attn_ops.nn.KVCache` /
    :class:`~attn_ops.nn.PagedKVCache` holds its ``num_kv_heads`` (the local count) only; an MLA rank
    keeps a full :class:`~attn_ops.nn.LatentKVCache` (the latent is shared by all heads).
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("tensor_parallel: torch.distributed is not initialized "
                           "(call torch.distributed.init_process_group first)")
    if not isinstance(module, (GroupedQueryAttention, MultiHeadLatentAttention)):
        raise TypeError(f"tensor_parallel: module must be a GroupedQueryAttention or a "
                        f"MultiHeadLatentAttention, got {type(module).__name__}")
    if module.tp_group is not None:
        raise ValueError("tensor_parallel: module is already a tensor-parallel shard (tp_group is set)")
    group = dist.group.WORLD if group is None else group
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("tensor_parallel: this process is not a member of group")
    world = dist.get_world_size(group)
    if module.num_heads % world:
        raise ValueError(f"tensor_parallel: num_heads ({module.num_heads}) must be divisible by the "
                         f"world size of the group ({world})")
    shard = _shard_gqa if isinstance(module, GroupedQueryAttention) else _shard_mla
    local = shard(module, rank, world, group)
    local.rope_cos, local.rope_sin = module.rope_cos, module.rope_sin  # the module's tables (e.g. YaRN)
    local.tp_group = group
    return local


def _copy_linear(layer: nn.Linear, weight: Tensor, bias) -> nn.Linear:
    """A new Linear holding copies of ``weight`` / ``bias`` (slices of ``layer``'s), same requires_grad."""
    out = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    out.weight = nn.Parameter(weight.detach().clone(memory_format=torch.contiguous_format),
                              requires_grad=layer.weight.requires_grad)
    if bias is not None:
        out.bias = nn.Parameter(bias.detach().clone(), requires_grad=layer.bias.requires_grad)
    return out


def _rows(layer: nn.Linear, start: int, n: int) -> nn.Linear:
    """Column-parallel shard: output features ``start .. start + n - 1`` (and their bias)."""
    bias = None if layer.bias is None else layer.bias[start:start + n]
    return _copy_linear(layer, layer.weight[start:start + n], bias)


def _columns(layer: nn.Linear, start: int, n: int) -> nn.Linear:
    """Row-parallel shard: input features ``start .. start + n - 1``; the bias is replicated."""
    return _copy_linear(layer, layer.weight[:, start:start + n], layer.bias)


def _sum_over_replicas(grad: Tensor, group, slot: int, slots: int) -> Tensor:
    """The sum of ``grad`` over the ranks holding the same KV head ``slot`` (of ``slots``): one
    all-reduce over ``group`` of a buffer where each rank fills its head's slot."""
    buf = grad.new_zeros(slots, *grad.shape)
    buf[slot] = grad
    dist.all_reduce(buf, group=group)
    return buf[slot]


def _shard_gqa(module: GroupedQueryAttention, rank: int, world: int, group) -> GroupedQueryAttention:
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
    local = GroupedQueryAttention(
        module.embed_dim, q_local, kv_local, D, rope_theta=module.rope_theta,
        sliding_window=module.sliding_window, rope_interleaved=module.rope_interleaved,
        max_position_embeddings=module.max_position_embeddings, device="meta",
        dtype=module.q_proj.weight.dtype)
    local.q_proj = _rows(module.q_proj, rank * q_local * D, q_local * D)
    local.k_proj = _rows(module.k_proj, kv_start * D, kv_local * D)
    local.v_proj = _rows(module.v_proj, kv_start * D, kv_local * D)
    local.o_proj = _columns(module.o_proj, rank * q_local * D, q_local * D)
    if replicated:
        hook = functools.partial(_sum_over_replicas, group=group, slot=kv_start, slots=Hkv)
        for p in (*local.k_proj.parameters(), *local.v_proj.parameters()):
            if p.requires_grad:
                p.register_hook(hook)
    return local


def _shard_mla(module: MultiHeadLatentAttention, rank: int, world: int,
               group) -> MultiHeadLatentAttention:
    H = module.num_heads // world
    local = MultiHeadLatentAttention(
        module.hidden_size, H, module.q_lora_rank, module.kv_lora_rank, module.qk_nope_head_dim,
        module.qk_rope_head_dim, module.v_head_dim, rope_theta=module.rope_theta,
        max_position_embeddings=module.max_position_embeddings, softmax_scale=module.softmax_scale,
        attention_bias=module.o_proj.bias is not None,
        rms_norm_eps=module.kv_a_layernorm.variance_epsilon, device="meta",
        dtype=module.o_proj.weight.dtype)
    qk, kv = module.qk_head_dim, module.qk_nope_head_dim + module.v_head_dim
    if module.q_lora_rank is None:
        local.q_proj = _rows(module.q_proj, rank * H * qk, H * qk)
    else:
        local.q_a_proj = copy.deepcopy(module.q_a_proj)
        local.q_a_layernorm = copy.deepcopy(module.q_a_layernorm)
        local.q_b_proj = _rows(module.q_b_proj, rank * H * qk, H * qk)
    local.kv_a_proj_with_mqa = copy.deepcopy(module.kv_a_proj_with_mqa)
    local.kv_a_layernorm = copy.deepcopy(module.kv_a_layernorm)
    local.kv_b_proj = _rows(module.kv_b_proj, rank * H * kv, H * kv)
    local.o_proj = _columns(module.o_proj, rank * H * module.v_head_dim, H * module.v_head_dim)
    return local


# --------------------------------------------------------------------------------------------------
# Merging attention over key shards held by different ranks
# --------------------------------------------------------------------------------------------------
def merge_attention_partials_across_ranks(out: Tensor, lse: Tensor, group=None) -> Tuple[Tensor, Tensor]:
    """:func:`merge_attention_partials` of every rank's ``(out, lse)`` (rank ``i`` holding key shard
    ``i`` for the same queries; same shapes on every rank): all-gathers them over ``group`` (default:
    the world) and returns the merged ``(out, lse)`` on every rank.

    Backward follows the tensor-parallel convention (every rank computes the same loss from the merged
    result): each rank gets the gradient of its own ``out`` / ``lse``, so its key shard's ``k`` / ``v``
    gradients are exact; the queries feed every rank's partial, so sum their gradients over the ranks
    (e.g. ``all_reduce(q.grad)``).
    """
    check_partials([out], [lse], "merge_attention_partials_across_ranks")
    outs, lses = gather_from_ranks(out, group), gather_from_ranks(lse, group)
    return merge_attention_partials(outs.unbind(0), lses.unbind(0))
