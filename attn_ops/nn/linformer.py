"""Linformer self-attention (Wang et al., 2020): keys and values are projected along the sequence
axis to ``proj_len`` rows, ``K' = E K`` and ``V' = F V``, then ordinary (bidirectional) attention runs
over those ``proj_len`` keys: time and memory linear in the sequence length. See docs/linformer.md.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor, nn

from .. import ops as _ops

__all__ = ["LinformerSelfAttention"]

_SHARING = ("none", "headwise", "key_value", "layerwise")


class LinformerSelfAttention(nn.Module):
    """Bidirectional multi-head (or grouped-query) self-attention with Linformer's sequence projections,
    on :func:`attn_ops.attention`.

    Parameters: ``q_proj`` (``hidden_size -> num_heads * head_dim``), ``k_proj`` / ``v_proj``
    (``hidden_size -> num_kv_heads * head_dim``), ``o_proj`` (``num_heads * head_dim -> hidden_size``), all
    with biases, and the sequence projections, by ``sharing`` (the paper's options):

    * ``"none"``: ``e_proj`` and ``f_proj`` of shape ``[num_kv_heads, proj_len, seq_len]``, one pair per
      key/value head (the query heads of a GQA group share their KV head's projected keys).
    * ``"headwise"``: ``e_proj``, ``f_proj`` ``[proj_len, seq_len]`` shared by every head.
    * ``"key_value"``: one ``e_proj`` ``[proj_len, seq_len]`` for keys and values (``F = E``) and heads.
    * ``"layerwise"``: one ``[proj_len, seq_len]`` matrix for keys, values, heads and every layer: pass
      the first layer's ``e_proj`` as ``shared_projection`` to the next layers (when it is ``None`` the
      layer creates it).

    Sequences shorter than ``seq_len``: a length ``T <= seq_len`` uses the first ``T`` columns of the
    projections, ``K' = E[:, :T] K``. That is exactly what zero-padding the keys and values to
    ``seq_len`` gives, so one module serves every length up to ``seq_len``; longer inputs are refused.
    (Padding *tokens*, or zeroed input rows, are not zeros after ``k_proj``, which has a bias: feed
    unpadded sequences.)

    The projections are initialized ``N(0, 1 / seq_len)``, so a projected row has the variance of a
    key row at full length.

    Args:
        hidden_size: model width; ``head_dim = hidden_size // num_heads``.
        num_heads: query heads. num_kv_heads: key/value heads (default ``num_heads``), dividing it.
        seq_len: the longest sequence ``n``. proj_len: the projected length ``k``.
        sharing: one of ``"none"``, ``"headwise"``, ``"key_value"``, ``"layerwise"``.
        shared_projection: with ``sharing="layerwise"``, a ``[proj_len, seq_len]`` parameter to share.
        softmax_scale: logit scale, default ``1 / sqrt(head_dim)``.
    """

    def __init__(self, hidden_size: int, num_heads: int, seq_len: int, proj_len: int, *,
                 num_kv_heads: Optional[int] = None, sharing: str = "none",
                 shared_projection: Optional[nn.Parameter] = None, softmax_scale: Optional[float] = None,
                 device=None, dtype=None):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads < 1 or hidden_size % num_heads:
            raise ValueError(f"LinformerSelfAttention: hidden_size expected a multiple of num_heads "
                             f"({num_heads}), got {hidden_size}")
        if num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(f"LinformerSelfAttention: num_kv_heads expected a divisor of num_heads ({num_heads}), "
                             f"got {num_kv_heads}")
        if seq_len < 1 or proj_len < 1:
            raise ValueError(f"LinformerSelfAttention: seq_len and proj_len expected >= 1, got seq_len={seq_len}, "
                             f"proj_len={proj_len}")
        if sharing not in _SHARING:
            raise ValueError(f"LinformerSelfAttention: sharing expected one of {_SHARING}, got {sharing!r}")
        if shared_projection is not None and sharing != "layerwise":
            raise ValueError(f"LinformerSelfAttention: shared_projection expected only with sharing='layerwise', "
                             f"got sharing={sharing!r}")
        if shared_projection is not None and not isinstance(shared_projection, nn.Parameter):
            # a plain tensor would be stored as an attribute: not trained, not saved, not moved by .to()
            raise TypeError(f"LinformerSelfAttention: shared_projection must be an nn.Parameter (the first layer's "
                            f"e_proj), got {type(shared_projection).__name__}")
        if shared_projection is not None and tuple(shared_projection.shape) != (proj_len, seq_len):
            raise ValueError(f"LinformerSelfAttention: shared_projection expected shape ({proj_len}, {seq_len}) "
                             f"[proj_len, seq_len], got {tuple(shared_projection.shape)}")
        factory = {"device": device, "dtype": dtype}
        self.hidden_size, self.num_heads, self.num_kv_heads = hidden_size, num_heads, num_kv_heads
        self.head_dim = hidden_size // num_heads
        self.softmax_scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(self.head_dim)
        self.seq_len, self.proj_len, self.sharing = seq_len, proj_len, sharing
        self.q_proj = nn.Linear(hidden_size, num_heads * self.head_dim, **factory)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * self.head_dim, **factory)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * self.head_dim, **factory)
        self.o_proj = nn.Linear(num_heads * self.head_dim, hidden_size, **factory)

        def projection(*lead: int) -> nn.Parameter:
            return nn.Parameter(torch.randn(*lead, proj_len, seq_len, **factory) / math.sqrt(seq_len))

        if sharing == "none":
            self.e_proj, self.f_proj = projection(num_kv_heads), projection(num_kv_heads)
        elif sharing == "headwise":
            self.e_proj, self.f_proj = projection(), projection()
        elif sharing == "key_value":
            self.e_proj, self.f_proj = projection(), None
        else:
            self.e_proj = projection() if shared_projection is None else shared_projection
            self.f_proj = None

    def _project(self, proj: Tensor, x: Tensor) -> Tensor:
        """``[.., proj_len, seq_len]`` applied along the sequence of x ``[B, T, Hkv, D]`` ->
        ``[B, proj_len, Hkv, D]``."""
        proj = proj[..., : x.shape[1]]
        if proj.dim() == 3:  # one matrix per KV head
            return torch.einsum("hpt,bthd->bphd", proj, x)
        return torch.einsum("pt,bthd->bphd", proj, x)

    def forward(self, x: Tensor) -> Tensor:
        """``x`` ``[batch, T, hidden_size]`` with ``T <= seq_len`` -> ``[batch, T, hidden_size]``."""
        if x.dim() != 3 or x.shape[-1] != self.hidden_size:
            raise ValueError(f"LinformerSelfAttention: x expected shape [batch, seq_len, {self.hidden_size}], "
                             f"got {list(x.shape)}")
        B, T, _ = x.shape
        if T > self.seq_len:
            raise ValueError(f"LinformerSelfAttention: x expected at most seq_len={self.seq_len} positions, got {T}")
        q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.head_dim)
        f_proj = self.e_proj if self.f_proj is None else self.f_proj
        out, _ = _ops.attention(q, self._project(self.e_proj, k), self._project(f_proj, v),
                                scale=self.softmax_scale)
        return self.o_proj(out.reshape(B, T, self.num_heads * self.head_dim))
