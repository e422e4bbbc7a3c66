"""Tensor parallelism: :func:`tensor_parallel` makes this rank's head-sharded copy of a
:class:`~attn_ops.nn.GroupedQueryAttention` or :class:`~attn_ops.nn.MultiHeadLatentAttention`, of the
parallel types in :mod:`attn_ops.parallel.layers` (Megatron-LM style: column-parallel q/k/v projections,
row-parallel ``o_proj`` with one all-reduce), for training and cached inference (docs/distributed.md)."""
from __future__ import annotations

from typing import Union

import torch.distributed as dist

from ..nn.attention import GroupedQueryAttention, MultiHeadAttention, MultiQueryAttention
from ..nn.mla import MultiHeadLatentAttention
from .layers import TensorParallelGroupedQueryAttention, TensorParallelMultiHeadLatentAttention

# The module types tensor_parallel shards (exactly: their shards keep these forwards).
_SHARDABLE = (GroupedQueryAttention, MultiQueryAttention, MultiHeadAttention, MultiHeadLatentAttention)

__all__ = ["tensor_parallel"]


def tensor_parallel(module: Union[GroupedQueryAttention, MultiHeadLatentAttention], group=None
                    ) -> Union[TensorParallelGroupedQueryAttention, TensorParallelMultiHeadLatentAttention]:
    """This rank's shard of ``module``: a new module of the parallel kind
    (:class:`~attn_ops.parallel.TensorParallelGroupedQueryAttention` for a GQA/MQA/MHA module,
    :class:`~attn_ops.parallel.TensorParallelMultiHeadLatentAttention` for MLA; subclasses of the
    single-process types) holding copies of its heads' weights; ``module`` is left unchanged. Every
    rank of ``group`` (default: the world) calls it with the same full module.

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
    parallel_types = (TensorParallelGroupedQueryAttention, TensorParallelMultiHeadLatentAttention)
    if isinstance(module, parallel_types):
        raise ValueError(f"tensor_parallel: module is already a tensor-parallel shard (a "
                         f"{type(module).__name__})")
    if type(module) not in _SHARDABLE:
        # a subclass (an integration's adapter) has its own forward and state, which a shard would drop
        raise TypeError(f"tensor_parallel: module must be one of {', '.join(t.__name__ for t in _SHARDABLE)}, "
                        f"not a subclass of them, got {type(module).__name__} (its shard would lose its own "
                        f"forward)")
    group = dist.group.WORLD if group is None else group
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("tensor_parallel: this process is not a member of group")
    world = dist.get_world_size(group)
    if module.num_heads % world:
        raise ValueError(f"tensor_parallel: num_heads ({module.num_heads}) must be divisible by the "
                         f"world size of the group ({world})")
    parallel = parallel_types[0] if isinstance(module, GroupedQueryAttention) else parallel_types[1]
    return parallel.from_module(module, rank, world, group)
