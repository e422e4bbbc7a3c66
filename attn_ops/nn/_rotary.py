"""The rotary-embedding plumbing the attention modules share: tables kept in float32 (float64 for a
float64 module), default positions, rotation in place or out of place."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from .. import ops as _ops


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
        # The tables before the cast (float32 / float64): maybe the caller's own (YaRN), which must survive it.
        cos, sin = self.rope_cos, self.rope_sin
        super()._apply(fn, recurse)
        after, device = self.rope_cos.dtype, self.rope_cos.device
        # Tables on the meta device hold no values: leaving it (to_empty() after a meta-device init) must compute
        # them, since load_state_dict does not restore these non-persistent buffers.
        left_meta = cos.device.type == "meta" and device.type != "meta"
        if not left_meta and (after == torch.float32 or after == cos.dtype == torch.float64):
            return self  # cast as wanted (float64 -> float32 rounds the better tables)
        # float32 tables for float16 / bfloat16 modules, float64 for float64 ones (_init_rotary's rule)
        table_dtype = torch.float64 if after == torch.float64 else torch.float32
        if left_meta or (table_dtype == torch.float64 and self._default_tables(cos, sin)):
            # computed: from meta, or float32 defaults to float64 (an upcast would keep float32's error)
            cos, sin = _ops.rotary_cos_sin(self.max_position_embeddings, self.rotary_dim, self.rope_theta,
                                           dtype=table_dtype, device=device)
        # else the tables from before the cast (a float16 copy would have lost digits), in table_dtype
        self.rope_cos, self.rope_sin = cos.to(device, table_dtype), sin.to(device, table_dtype)
        return self

    def _default_tables(self, cos: Tensor, sin: Tensor) -> bool:
        """Whether ``cos`` / ``sin`` are the tables this module computed (not ones the caller wrote)."""
        if cos.device.type == "meta":
            return True
        default_cos, default_sin = _ops.rotary_cos_sin(self.max_position_embeddings, self.rotary_dim,
                                                       self.rope_theta, dtype=cos.dtype, device=cos.device)
        return torch.equal(cos, default_cos) and torch.equal(sin, default_sin)

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
