"""Bahdanau (additive) attention on the fused :func:`attn_ops.additive_attention` op:
``score_ij = w . tanh(W_q q_i + W_k k_j)``, never materializing ``[batch, Tq, Tk, hidden]``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from .. import ops as _ops

__all__ = ["AdditiveAttention"]


class AdditiveAttention(nn.Module):
    """Additive attention of Bahdanau et al. (2015), for encoder-decoder models.

    Parameters: ``w_q`` (``nn.Linear(query_dim, hidden_dim, bias=False)``), ``w_k``
    (``nn.Linear(key_dim, hidden_dim)``, which carries the one bias the score needs) and ``w``
    (``[hidden_dim]``, the score vector ``v_a`` of the paper).

    Values default to the keys (the encoder states, as in the paper); ``value_dim`` declares another
    width for values passed separately (it defaults to ``key_dim``).

    A decoder loop projects the encoder states once with :meth:`project_keys` and passes them as
    ``projected_keys`` at every step, so each step costs only ``W_q`` on the new query and the fused op::

        kp = attn.project_keys(encoder_states)          # [B, Tk, hidden_dim], once per source
        for step in range(steps):
            context, _ = attn(decoder_state, encoder_states, projected_keys=kp, key_padding_mask=pad)
    """

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int, value_dim: Optional[int] = None, *,
                 device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.query_dim, self.key_dim, self.hidden_dim = query_dim, key_dim, hidden_dim
        self.value_dim = key_dim if value_dim is None else value_dim
        self.w_q = nn.Linear(query_dim, hidden_dim, bias=False, **factory)
        self.w_k = nn.Linear(key_dim, hidden_dim, **factory)
        self.w = nn.Parameter(torch.empty(hidden_dim, **factory))
        nn.init.uniform_(self.w, -hidden_dim ** -0.5, hidden_dim ** -0.5)

    def project_keys(self, key: Tensor) -> Tensor:
        """``W_k key``: ``[B, Tk, key_dim]`` -> ``[B, Tk, hidden_dim]``; reuse it for every query of a source."""
        if key.dim() != 3 or key.shape[-1] != self.key_dim:
            raise ValueError(f"AdditiveAttention: key expected shape [batch, key_len, {self.key_dim}], "
                             f"got {list(key.shape)}")
        return self.w_k(key)

    def forward(self, query: Tensor, key: Tensor, value: Optional[Tensor] = None, *,
                projected_keys: Optional[Tensor] = None, key_padding_mask: Optional[Tensor] = None,
                return_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """Attend from ``query`` ``[B, Tq, query_dim]`` (or one step ``[B, query_dim]``) over ``key``
        ``[B, Tk, key_dim]``.

        Args:
            value: ``[B, Tk, value_dim]``; default ``key``.
            projected_keys: ``project_keys(key)`` computed earlier (skips ``W_k``).
            key_padding_mask: bool ``[B, Tk]``, True marks a padded key.
            return_weights: also return the attention weights ``[B, Tq, Tk]`` (``[B, Tk]`` for one step).

        Returns:
            ``(context, weights)``: ``context`` ``[B, Tq, value_dim]`` (``[B, value_dim]`` for one
            step), ``weights`` or ``None``. A query whose keys are all padded gets a zero context.
        """
        step = query.dim() == 2
        if step:
            query = query.unsqueeze(1)
        if query.dim() != 3 or query.shape[-1] != self.query_dim:
            raise ValueError(f"AdditiveAttention: query expected shape [batch, query_len, {self.query_dim}] or "
                             f"[batch, {self.query_dim}], got {list(query.shape)}")
        kp = self.project_keys(key) if projected_keys is None else projected_keys
        value = key if value is None else value
        if value.shape[-1] != self.value_dim:
            raise ValueError(f"AdditiveAttention: value expected last dim value_dim={self.value_dim}, "
                             f"got {list(value.shape)}")
        qp = self.w_q(query)
        # one dtype for the op: under torch.autocast the projections come out in the autocast dtype while the
        # parameter w and an unprojected value stay float32
        dtype = qp.dtype
        out, _, weights = _ops.additive_attention(qp, kp.to(dtype), self.w.to(dtype), value.to(dtype),
                                                  key_padding_mask=key_padding_mask, return_weights=return_weights)
        if step:
            out, weights = out.squeeze(1), (weights.squeeze(1) if return_weights else weights)
        return out, (weights if return_weights else None)
