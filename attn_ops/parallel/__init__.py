"""Parallel attention (docs/distributed.md): heads sharded over ranks, and attention over key shards merged.

* :func:`tensor_parallel` (``sharding``): this rank's head-sharded copy of a GQA / MQA / MHA or MLA
  module (Megatron-LM style), for training and cached inference.
* :class:`ColumnParallelLinear`, :class:`RowParallelLinear`, :class:`TensorParallelGroupedQueryAttention`,
  :class:`TensorParallelMultiHeadLatentAttention` (``layers``): the parallel types it returns.
* :func:`merge_attention_partials`, :func:`merge_attention_partials_across_ranks` (``merge``): the exact
  attention over the union of disjoint key shards from each shard's ``(out, lse)``, in one process or
  across the ranks of a group.
* :func:`copy_to_ranks`, :func:`reduce_from_ranks`, :func:`gather_from_ranks` (``collectives``): the
  differentiable collectives (Megatron-LM's ``f`` / ``g``) the above communicate with.

``attn_ops`` exports :func:`tensor_parallel` and :func:`merge_attention_partials`, and ``attn_ops.nn`` the
four parallel types.
"""
from .collectives import copy_to_ranks, gather_from_ranks, reduce_from_ranks
from .layers import (ColumnParallelLinear, RowParallelLinear, TensorParallelGroupedQueryAttention,
                     TensorParallelMultiHeadLatentAttention)
from .merge import merge_attention_partials, merge_attention_partials_across_ranks
from .sharding import tensor_parallel

__all__ = [
    "tensor_parallel",
    "ColumnParallelLinear",
    "RowParallelLinear",
    "TensorParallelGroupedQueryAttention",
    "TensorParallelMultiHeadLatentAttention",
    "merge_attention_partials",
    "merge_attention_partials_across_ranks",
    "copy_to_ranks",
    "reduce_from_ranks",
    "gather_from_ranks",
]
