"""Lightning attention module (MiniMax-Text-01's linear-attention layer).

* :class:`LightningAttention`: ``qkv_proj`` -> activation -> per-head lightning attention with a fixed
  per-head decay (``slope_rate``) -> RMS ``norm`` -> ``sigmoid(output_gate(x))`` gate -> ``out_proj``, with
  transformers' ``MiniMaxLightningAttention`` parameter names, so its state dict loads unchanged. Without a
  state it runs :func:`attn_ops.lightning_attention` (differentiable, training and prefill); with a state
  pool it advances the pool in place with :func:`attn_ops.lightning_attention_decode_` (decode, chunked
  prefill, speculative verification).
* Its cache, :class:`~attn_ops.caches.LinearAttentionState` (one ``[num_slots, H, Dk, Dv]`` float32 pool per
  layer), lives in :mod:`attn_ops.caches`.
"""
from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import ops as _ops
from .._checks import check_positive
from ..caches import LinearAttentionState
from ._norm import _RMSNorm

__all__ = ["LightningAttention", "minimax_slope_rate"]

# Buffers of transformers' module that this one derives on the fly (dropped when a state dict is loaded).
_DERIVED_BUFFERS = ("query_decay", "key_decay", "diagonal_decay")


def minimax_slope_rate(num_heads: int, layer_idx: int, num_layers: int) -> Tensor:
    """MiniMax-Text-01's decay rates ``[num_heads]`` (float32): ``2^(-8 (h+1) / H)``, scaled by
    ``1 - layer_idx / (num_layers - 1) + 1e-5`` so deeper layers forget more slowly."""
    base = 1 / (2 ** (8 / num_heads))
    factor = 1 - layer_idx / (num_layers - 1 + 1e-5) + 1e-5
    return (base ** (torch.arange(num_heads) + 1)) * factor


class LightningAttention(nn.Module):
    """MiniMax-style lightning attention layer over ``x [B, T, hidden_size]``.

    Args:
        hidden_size, num_heads, head_dim: model width, heads, per-head width (default ``hidden_size // num_heads``).
        layer_idx, num_layers: select the layer's decay rates (:func:`minimax_slope_rate`).
        hidden_act: activation applied to ``qkv_proj``'s output (MiniMax: ``"silu"``).
        block_size: block length of the chunked kernel (``None``: the op's default); not a semantic choice.
        eps: epsilon of the output RMS norm.

    ``slope_rate`` is a buffer ``[H, 1, 1]`` (as transformers keeps it) and gets no gradient.
    """

    def __init__(self, hidden_size: int, num_heads: int, head_dim: Optional[int] = None, *, layer_idx: int = 0,
                 num_layers: int = 1, hidden_act: str = "silu", block_size: Optional[int] = None, eps: float = 1e-6,
                 device=None, dtype=None):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        check_positive("hidden_size", hidden_size)
        check_positive("num_heads", num_heads)
        self.head_dim = hidden_size // num_heads if head_dim is None else check_positive("head_dim", head_dim)
        if self.head_dim == 0:
            raise ValueError(f"hidden_size // num_heads must be >= 1 when head_dim is not given, got {hidden_size} "
                             f"// {num_heads}")
        self.num_attention_heads = num_heads
        self.layer_idx = layer_idx
        self.block_size = block_size
        inner = num_heads * self.head_dim
        self.act_fn = _activation(hidden_act)
        self.norm = _RMSNorm(inner, eps, compute_dtype=torch.float32, **kw)
        self.qkv_proj = nn.Linear(hidden_size, 3 * inner, bias=False, **kw)
        self.out_proj = nn.Linear(inner, hidden_size, bias=False, **kw)
        self.output_gate = nn.Linear(hidden_size, inner, bias=False, **kw)
        slope = minimax_slope_rate(num_heads, layer_idx, num_layers)[:, None, None]
        self.register_buffer("slope_rate", slope if device is None else slope.to(device))

    @property
    def slope(self) -> Tensor:
        """The decay rates as the ops take them: float32 ``[H]``."""
        return self.slope_rate.reshape(-1).float()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name in _DERIVED_BUFFERS:
            state_dict.pop(prefix + name, None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def qkv(self, x: Tensor, padding_mask: Optional[Tensor] = None):
        """``q, k, v`` ``[B, T, H, D]`` (strided views of one projection). ``padding_mask`` (``[B, T]``, 1 = real
        token) zeroes the padding tokens' q/k/v, so they add nothing to the state."""
        B, T, _ = x.shape
        qkv = self.act_fn(self.qkv_proj(x))
        if padding_mask is not None:
            qkv = (qkv * padding_mask[:, :, None]).to(qkv.dtype)
        qkv = qkv.view(B, T, self.num_attention_heads, 3 * self.head_dim)
        return qkv.split(self.head_dim, dim=-1)

    def output(self, x: Tensor, attn: Tensor) -> Tensor:
        """Norm, gate and output projection of the attention result ``attn [B, T, H, D]``."""
        attn = self.norm(attn.reshape(*attn.shape[:2], -1))
        return self.out_proj(torch.sigmoid(self.output_gate(x)) * attn)

    def forward(self, x: Tensor, *, state: Union[None, Tensor, "LinearAttentionState"] = None,
                state_indices: Optional[Tensor] = None, padding_mask: Optional[Tensor] = None) -> Tensor:
        """Without ``state``: causal lightning attention over ``x`` from a zero state (differentiable). With
        ``state`` (a :class:`LinearAttentionState`, or one layer's pool ``[N, H, D, D]``): continue each row
        from slot ``state_indices[b]`` (default: slot ``b``) and update the slot in place."""
        q, k, v = self.qkv(x, padding_mask)
        if state is None:
            attn, _ = _ops.lightning_attention(q, k, v, self.slope, block_size=self.block_size)
        else:
            pool = state.layer(self.layer_idx) if isinstance(state, LinearAttentionState) else state
            attn = _ops.lightning_attention_decode_(q, k, v, pool, self.slope, state_indices=state_indices)
        return self.output(x, attn)


def _activation(name: str):
    table = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}
    if name not in table:
        raise ValueError(f"hidden_act must be one of {sorted(table)}, got {name!r}")
    return table[name]
