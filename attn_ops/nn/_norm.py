"""The RMS norm of the MLA and lightning modules (HuggingFace's ``DeepseekV3RMSNorm`` /
``MiniMaxRMSNorm``, parameter ``weight``, attribute ``variance_epsilon``, so their state dicts load)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn


class _RMSNorm(nn.Module):
    """RMS norm over the last dim: normalize in ``compute_dtype``, round to the input dtype, then scale by
    ``weight``. ``compute_dtype=None`` computes in float32, or float64 for float64 inputs (MLA);
    ``torch.float32`` always in float32, as MiniMax's ``MiniMaxRMSNorm`` (lightning)."""

    def __init__(self, size: int, eps: float = 1e-6, *, compute_dtype: Optional[torch.dtype] = None, device=None,
                 dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, device=device, dtype=dtype))
        self.variance_epsilon = eps
        self.compute_dtype = compute_dtype

    def forward(self, x: Tensor) -> Tensor:
        dtype = torch.promote_types(x.dtype, torch.float32) if self.compute_dtype is None else self.compute_dtype
        h = x.to(dtype)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"
