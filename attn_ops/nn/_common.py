"""What the attention modules share: argument checks and the rotary-embedding plumbing (tables kept in
float32, default positions, rotation in place or out of place)."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from .. import ops as _ops


def check_positive(name: str, value: int, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum`` (bools refused), else ``ValueError`` naming ``name``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


class RotaryTables(nn.Module):
    """Rotary tables of a module: non-persistent buffers ``rope_cos`` / ``rope_sin``
    ``[max_position_embeddings, rotary_dim // 2]`` from :func:`attn_ops.rotary_cos_sin`, kept float32
    (float64 for a float64 module) when the module is cast to float16 / bfloat16: the op computes in
    float32 and accepts float32 tables for any ``x`` dtype."""

    rope_cos: Tensor
    rope_sin: Tensor

    def _init_rotary(self, rotary_dim: int, rope_theta: float, max_position_embeddings: int, dtype,
                     device) -> None:
        self.rotary_dim = rotary_dim
        self.rope_theta = float(rope_theta)
        self.max_position_embeddings = max_position_embeddings
        table_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        cos, sin = _ops.rotary_cos_sin(max_position_embeddings, rotary_dim, self.rope_theta, dtype=table_dtype,
                                       device=device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def _apply(self, fn, recurse=True):
        before = self.rope_cos.dtype
        super()._apply(fn, recurse)
        after = self.rope_cos.dtype
        # Tables of float32 for float16 / bfloat16 modules, float64 for float64 ones (_init_rotary's rule),
        # recomputed, not cast: a float16 copy lost digits, and a float64 copy of float32 tables keeps their error.
        if after not in (torch.float32, torch.float64):
            table_dtype = torch.float32
        elif after == torch.float64 and before != torch.float64:
            table_dtype = torch.float64
        else:
            return self
        if self.rope_cos.device.type == "meta":
            cos, sin = self.rope_cos.to(table_dtype), self.rope_sin.to(table_dtype)
        else:
            cos, sin = _ops.rotary_cos_sin(self.max_position_embeddings, self.rotary_dim, self.rope_theta,
                                           dtype=table_dtype, device=self.rope_cos.device)
        self.rope_cos, self.rope_sin = cos, sin
        return self

    def _tables(self, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
        """The tables for an input of ``dtype`` (float64 tables only for float64 inputs)."""
        cos, sin = self.rope_cos, self.rope_sin
        if cos.dtype != torch.float32 and cos.dtype != dtype:
            cos, sin = cos.float(), sin.float()
        return cos, sin


def positions_for(positions: Optional[Tensor], B: int, T: int, device, cache=None) -> Tensor:
    """``[B, T]`` rotary positions: the given ``[T]`` or ``[B, T]`` ones, else the cache positions of the
    next ``T`` tokens (``cache.seqlens[b] + t``), else ``0 .. T-1``."""
    if positions is None:
        return cache.positions(B, T) if cache is not None else torch.arange(T, device=device).expand(B, T)
    return positions.expand(B, T) if positions.dim() == 1 else positions


def rotate(x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor, *, interleaved: bool,
           in_place: bool) -> Tensor:
    """``x`` rotated: in place (cached inference, nothing to differentiate) or out of place
    (differentiable). An ``x`` that requires grad is always rotated out of place."""
    if in_place and not x.requires_grad:
        _ops.rotary_embedding_(x, cos, sin, positions, interleaved=interleaved)
        return x
    return _ops.rotary_embedding(x, cos, sin, positions, interleaved=interleaved)
