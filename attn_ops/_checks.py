"""Argument checks shared by the modules and the cache objects: positive ints and integer-valued
inputs (bools and floats refused rather than silently converted)."""
from __future__ import annotations

import torch
from torch import Tensor


def is_integer_dtype(dtype: torch.dtype) -> bool:
    """Whether ``dtype`` holds integers (bool does not count: as an index, True / False would be rows 1 / 0)."""
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def integer_values(what: str, name: str, values) -> Tensor:
    """``values`` (an int, a sequence or a tensor) as a 1-D int64 CPU tensor; ``ValueError`` for bools and
    non-integers, which would otherwise become 0 / 1 or be truncated (1.9 -> 1) without a word."""
    given = torch.as_tensor(values)
    if given.numel() and not is_integer_dtype(given.dtype):
        raise ValueError(f"{what}: {name} must be integers, got {given.dtype}")
    return given.reshape(-1).to("cpu", torch.int64)


def check_positive(name: str, value: int, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum`` (bools refused), else ``ValueError`` naming ``name``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value
