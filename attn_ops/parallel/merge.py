"""Merging attention computed over disjoint key shards by its log-sum-exp (split-KV, context parallel,
cascade attention): :func:`merge_attention_partials`, plain tensor math on the ``(out, lse)`` pairs every
attention op returns, in one process; :func:`merge_attention_partials_across_ranks`, the same over the
pairs of the ranks of a process group."""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch
from torch import Tensor

from .collectives import gather_from_ranks

__all__ = ["merge_attention_partials", "merge_attention_partials_across_ranks"]


def _shape(t: Tensor) -> List[int]:
    return list(t.shape)


def check_partials(outs: List[Tensor], lses: List[Tensor], name: str) -> None:
    if not outs or len(outs) != len(lses):
        raise ValueError(f"{name}: outs and lses must be sequences of the same non-zero length, got "
                         f"{len(outs)} outs and {len(lses)} lses")
    o0, l0 = outs[0], lses[0]
    if o0.dim() not in (3, 4):
        raise ValueError(f"{name}: outs[0] must be a 4-D tensor [batch, seqlen_q, heads, head_dim_v] or a "
                         f"3-D tensor [total_q, heads, head_dim_v], got a {o0.dim()}-D tensor of shape "
                         f"{_shape(o0)}")
    lse_shape = [*o0.shape[:-3], o0.shape[-2], o0.shape[-3]]
    layout = "[batch, heads, seqlen_q]" if o0.dim() == 4 else "[heads, total_q]"
    if l0.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"{name}: lses[0] must be float32 or float64, got {l0.dtype}")
    for i, (o, l) in enumerate(zip(outs, lses)):
        if o.shape != o0.shape or o.dtype != o0.dtype or o.device != o0.device:
            raise ValueError(f"{name}: outs[{i}] must have the shape, dtype and device of outs[0] "
                             f"({_shape(o0)}, {o0.dtype}, {o0.device}), got {_shape(o)}, {o.dtype}, "
                             f"{o.device}")
        if _shape(l) != lse_shape or l.dtype != l0.dtype or l.device != o0.device:
            raise ValueError(f"{name}: lses[{i}] must have shape {lse_shape} ({layout} for outs of shape "
                             f"{_shape(o0)}), dtype {l0.dtype} and device {o0.device}, got "
                             f"{_shape(l)}, {l.dtype}, {l.device}")


def merge_attention_partials(outs: Sequence[Tensor], lses: Sequence[Tensor]) -> Tuple[Tensor, Tensor]:
    """Attention over the union of disjoint key shards, from each shard's ``(out, lse)``.

    ``outs[i]``, ``lses[i]``: what :func:`attn_ops.attention` (or ``attention_with_kvcache``) returns for
    the same queries over key shard ``i`` -- ``out`` ``[B, Tq, H, Dv]`` with ``lse`` ``[B, H, Tq]``, or
    varlen ``[total_q, H, Dv]`` with ``[H, total_q]``; all outs one dtype and device, lses float32 or
    float64 (one dtype). Returns ``(out, lse)`` in the same layouts and dtypes:
    ``lse = log(sum_i exp(lse_i))`` and ``out = sum_i exp(lse_i - lse) * out_i``, computed in the lse
    dtype (at least float32) around the row maximum. A query row with no visible key in any shard (all
    ``lse_i = -inf``) gives ``out = 0``, ``lse = -inf``; shards where a row sees no key
    (``lse_i = -inf``) get weight 0. Differentiable in every ``out_i`` and ``lse_i`` (the attention op
    takes the ``lse`` gradient), with zero, never NaN, gradients for rows without keys.
    """
    outs, lses = list(outs), list(lses)
    check_partials(outs, lses, "merge_attention_partials")
    lse = torch.stack(lses)                                     # [N, *lse_shape]
    m = lse.detach().amax(0)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)  # rows with no key anywhere: 0
    w = torch.exp(lse - m)                                      # exp(-inf) = 0; NaN stays NaN
    total = w.sum(0)
    seen = total != 0                                           # a NaN total is "seen": NaN reaches the result
    total = torch.where(seen, total, torch.ones_like(total))
    merged_lse = torch.where(seen, m + torch.log(total), torch.full_like(total, float("-inf")))
    w = (w / total).transpose(-1, -2).unsqueeze(-1)             # [N, *out_shape[:-1], 1]
    out = (w * torch.stack(outs).to(w.dtype)).sum(0)
    return out.to(outs[0].dtype), merged_lse


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
