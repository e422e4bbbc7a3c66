"""FlashAttention's ``flash_attn.bert_padding`` helpers (padded batch <-> packed varlen tokens), in plain
differentiable PyTorch; the shim (attn_ops.flash_attn_shim) serves them as ``flash_attn.bert_padding``."""

from typing import Optional

import torch
from torch import Tensor

__all__ = ["index_first_axis", "index_put_first_axis", "pad_input", "unpad_input"]


def index_first_axis(input: Tensor, indices: Tensor) -> Tensor:
    """``input[indices]`` along the first axis: [N, ...] -> [len(indices), ...] (differentiable)."""
    return input.index_select(0, indices)


def index_put_first_axis(values: Tensor, indices: Tensor, first_axis_dim: int) -> Tensor:
    """A zero tensor [first_axis_dim, ...] with ``values`` [len(indices), ...] at rows ``indices``
    (differentiable)."""
    out = values.new_zeros((first_axis_dim, *values.shape[1:]))
    return out.index_put((indices,), values)


def unpad_input(hidden_states: Tensor, attention_mask: Tensor, unused_mask: Optional[Tensor] = None):
    """hidden_states [B, S, ...] and attention_mask [B, S] (1 = token) -> (tokens [nnz, ...], indices [nnz] into
    the flattened [B * S], cu_seqlens int32 [B + 1], max_seqlen (int), seqused int32 [B]).

    With ``unused_mask`` [B, S] (1 = allocated but unused), its tokens are kept as well (they count in
    cu_seqlens and max_seqlen) and ``seqused`` counts the attention_mask tokens alone.
    """
    selected = attention_mask if unused_mask is None else attention_mask + unused_mask
    seqlens = selected.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(selected.flatten(), as_tuple=False).flatten()
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    return (index_first_axis(hidden_states.flatten(0, 1), indices), indices, cu_seqlens, int(seqlens.max()), used)


def pad_input(hidden_states: Tensor, indices: Tensor, batch: int, seqlen: int) -> Tensor:
    """The inverse of :func:`unpad_input`: tokens [nnz, ...] -> [batch, seqlen, ...], zeros at padding."""
    return index_put_first_axis(hidden_states, indices, batch * seqlen).unflatten(0, (batch, seqlen))
