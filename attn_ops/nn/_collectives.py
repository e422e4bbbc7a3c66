"""Differentiable collectives for tensor-parallel attention (Megatron-LM's ``f`` / ``g`` operators).

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

from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn


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
    """``f``: identity forward; backward sums the gradient over ``group`` (``x`` unchanged without a
    group)."""
    return x if group is None else _CopyToRanks.apply(x, group)


def reduce_from_ranks(x: Tensor, group) -> Tensor:
    """``g``: the sum of ``x`` over the ranks of ``group``; backward passes the gradient through."""
    return _ReduceFromRanks.apply(x, group)


def gather_from_ranks(x: Tensor, group) -> Tensor:
    """``[world_size, *x.shape]``: every rank's ``x`` in rank order; backward keeps this rank's slice."""
    return _GatherFromRanks.apply(x, group)


def output_projection(o_proj: nn.Linear, h: Tensor, group: Optional[object]) -> Tensor:
    """``o_proj(h)``; under tensor parallelism (``group`` given) ``o_proj`` is row-parallel: each rank
    multiplies its heads' columns, one all-reduce sums the partial products, and the (replicated) bias
    is added once, after the sum."""
    if group is None:
        return o_proj(h)
    out = reduce_from_ranks(F.linear(h, o_proj.weight), group)
    return out if o_proj.bias is None else out + o_proj.bias
