"""Differentiable collectives for tensor-parallel attention (Megatron-LM's ``f`` / ``g`` operators),
used by the parallel layers (:mod:`attn_ops.parallel.layers`) and the cross-rank merge
(:func:`attn_ops.parallel.merge_attention_partials_across_ranks`).

Convention (as Megatron-LM): every rank of the group holds the same activations outside the
attention module and computes the same loss from the module's (replicated) output. So

* :func:`copy_to_ranks` (``f``) marks where a replicated tensor enters per-rank (sharded) work:
  identity forward, all-reduce (sum) of the gradient in backward, because each rank's gradient only
  covers its own heads;
* :func:`reduce_from_ranks` (``g``) sums the per-rank partial results: all-reduce forward, identity
  backward (the gradient of the replicated output is already the same on every rank);
* :func:`gather_from_ranks` stacks each rank's tensor: all-gather forward, backward keeps this rank's
  slice of the (replicated) gradient.

``torch.distributed.nn.functional.all_reduce`` is not the ``g`` operator: its backward all-reduces the
gradient again, which under this convention multiplies it by the world size.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["copy_to_ranks", "reduce_from_ranks", "gather_from_ranks"]


class _CopyToRanks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromRanks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromRanks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.rank = dist.get_rank(group)
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x, group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, grad):
        return grad[ctx.rank], None


def copy_to_ranks(x: Tensor, group) -> Tensor:
    """``f``: identity forward; backward sums the gradient over ``group``. ``None`` is the default group,
    as for the other two (and torch.distributed's collectives); without an initialized process group,
    ``x`` is returned unchanged."""
    if group is None and not (dist.is_available() and dist.is_initialized()):
        return x
    return _CopyToRanks.apply(x, group)


def reduce_from_ranks(x: Tensor, group) -> Tensor:
    """``g``: the sum of ``x`` over the ranks of ``group``; backward passes the gradient through."""
    return _ReduceFromRanks.apply(x, group)


def gather_from_ranks(x: Tensor, group) -> Tensor:
    """``[world_size, *x.shape]``: every rank's ``x`` in rank order; backward keeps this rank's slice."""
    return _GatherFromRanks.apply(x, group)
