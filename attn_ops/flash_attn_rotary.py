"""FlashAttention's ``flash_attn.layers.rotary.apply_rotary_emb`` on attn_ops' rotary_embedding op; the shim
(attn_ops.flash_attn_shim) serves it as ``flash_attn.layers.rotary``."""

from typing import Optional, Union

import torch
from torch import Tensor

from . import ops
from ._flash_attn_kvcache import token_rows

__all__ = ["apply_rotary_emb"]


def apply_rotary_emb(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False, inplace: bool = False,
                     seqlen_offsets: Union[int, Tensor] = 0, cu_seqlens: Optional[Tensor] = None,
                     max_seqlen: Optional[int] = None) -> Tensor:
    """Rotates the first ``rotary_dim = 2 * cos.shape[1]`` features of x [B, S, H, D] (or packed [total, H, D]
    with ``cu_seqlens`` [B + 1]); token i of sequence b sits at position ``seqlen_offsets[b] + i`` (an int
    offsets every sequence alike). cos / sin: [seqlen_rotary, rotary_dim / 2]. ``interleaved`` pairs features
    (2i, 2i + 1) (GPT-J), else (i, i + rotary_dim / 2) (GPT-NeoX). ``inplace`` writes the result into x and
    returns it. Differentiable. ``max_seqlen`` is a hint FlashAttention's kernel uses; not needed here.
    """
    if cu_seqlens is None:
        batch, seqlen = x.shape[:2]
        pos = torch.arange(seqlen, device=x.device).expand(batch, seqlen)
        offsets = seqlen_offsets[:, None] if isinstance(seqlen_offsets, Tensor) else seqlen_offsets
    else:
        row = token_rows(cu_seqlens, x.shape[0])
        pos = torch.arange(x.shape[0], device=x.device) - cu_seqlens.long()[row]
        offsets = seqlen_offsets.long()[row] if isinstance(seqlen_offsets, Tensor) else seqlen_offsets
    pos = pos + offsets
    if not inplace:
        return ops.rotary_embedding(x, cos, sin, pos, interleaved=interleaved)
    if torch.is_grad_enabled() and x.requires_grad:
        return x.copy_(ops.rotary_embedding(x, cos, sin, pos, interleaved=interleaved))
    ops.rotary_embedding_(x, cos, sin, pos, interleaved=interleaved)
    return x
