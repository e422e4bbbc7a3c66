"""What the KV and latent caches share: the per-row lengths and everything done with them (positions,
advancing, reset / free_rows / truncate), sizes, per-layer storage allocation, and the contiguous
layout's ``batch_size`` rows of ``capacity`` tokens."""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from .. import _huge_pages
from .._checks import check_positive, integer_values

Rows = Union[int, Sequence[int], Tensor]


def _per_layer(num_layers: int, shape: Tuple[int, ...], dtype: torch.dtype, device) -> List[Tensor]:
    """``num_layers`` zero tensors of ``shape`` (separate allocations, so compiled code never sees
    aliased inputs); on a Linux CPU, in transparent huge pages (attn_ops/_huge_pages.py: faster decode)."""
    return [_huge_pages.zeros(*shape, dtype=dtype, device=device) for _ in range(num_layers)]


def _row_list(rows: Rows, n: int, what: str) -> List[int]:
    rows = integer_values(what, "rows", rows).tolist()  # a bool mask would have freed rows 0 and 1
    for r in rows:
        if not 0 <= r < n:
            raise IndexError(f"{what}: row {r} is out of range [0, {n})")
    return rows


CACHE_8BIT_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def _cache_scale(name: str, scale, dtype: torch.dtype, heads: int, device) -> Optional[Tensor]:
    """The dequantization scale an 8-bit cache keeps (float32 ``[1]`` or ``[heads]`` on the cache's device; default
    1), or None for a 16/32-bit cache, which takes no scale. The ops check the values at their first use."""
    if dtype not in CACHE_8BIT_DTYPES:
        if scale is not None:
            raise ValueError(f"{name} applies to 8-bit caches (torch.float8_e4m3fn, torch.float8_e5m2) only, "
                             f"got dtype={dtype}")
        return None
    t = torch.as_tensor(1.0 if scale is None else scale, dtype=torch.float32,
                        device=_huge_pages.resolve_device(device)).reshape(-1).clone()
    if t.numel() not in (1, heads):
        raise ValueError(f"{name} must hold one value or one per KV head ({heads}), got {t.numel()} values")
    return t


class _CacheBase:
    """What every cache shares: lengths, positions, advancing, host-side length management, sizes.
    Subclasses hold their per-layer storage tensors (``[rows, slots, *per_token]``) and list them in
    :meth:`_storage`."""

    num_layers: int
    seqlens: Tensor  # int32 [rows]; the live lengths (modified in place)

    def _storage(self) -> List[Tensor]:
        raise NotImplementedError

    def _layout(self, layer_storage: Tuple[Tensor, ...],
                batch_size: int) -> Tuple[Tuple[Tensor, ...], Optional[Tensor]]:
        """What the attention ops read for rows ``0 .. batch_size-1``: the layer's storage tensors and the
        block table (``None`` for contiguous rows). Defined by the layouts (``_ContiguousRows``,
        ``_PagedBase``)."""
        raise NotImplementedError

    def _rows(self, t: Tensor, batch_size: int) -> Tensor:
        """The first ``batch_size`` rows of ``t`` (``t`` itself when that is all of them); a batch larger
        than the cache is the caller's mistake, said as such (not as an op's index error)."""
        rows = t.shape[0]
        if batch_size > rows:
            raise ValueError(f"{type(self).__name__}: the input has batch size {batch_size}, but the cache "
                             f"has only {rows} rows")
        return t if batch_size == rows else t[:batch_size]

    # ---- used inside a (possibly compiled) forward: tensor ops only -------------------------
    def positions(self, batch_size: int, num_tokens: int) -> Tensor:
        """``int32 [B, T]``: the cache positions of the next ``T`` tokens of rows ``0 .. B-1``
        (``seqlens[b] + t``)."""
        seqlens = self._rows(self.seqlens, batch_size)
        t = torch.arange(num_tokens, dtype=torch.int32, device=seqlens.device)
        return seqlens.unsqueeze(1) + t

    def advance(self, num_tokens: Union[int, Tensor], batch_size: Optional[int] = None) -> None:
        """Add ``num_tokens`` to the lengths of rows ``0 .. batch_size-1`` (all rows by default), in
        place. The attention modules call it after the last layer (``layer_idx == num_layers - 1``);
        call it yourself only when you append with the ops directly."""
        rows = self.seqlens if batch_size is None else self._rows(self.seqlens, batch_size)
        rows.add_(num_tokens)

    # ---- host side, between steps ------------------------------------------------------------
    def lengths(self) -> Tensor:
        """A copy of the current lengths (``int32 [rows]``)."""
        return self.seqlens.clone()

    def reset(self) -> None:
        """Empty every row (lengths 0). The stored values are left as they are (they are
        overwritten by the next appends)."""
        self.seqlens.zero_()

    def free_rows(self, rows: Rows) -> None:
        """Empty the given rows (lengths 0)."""
        idx = _row_list(rows, self.seqlens.shape[0], f"{type(self).__name__}.free_rows")
        if idx:
            self.seqlens[torch.tensor(idx, dtype=torch.long, device=self.seqlens.device)] = 0

    def truncate(self, lengths: Union[Sequence[int], Tensor]) -> None:
        """Set the lengths of rows ``0 .. len(lengths)-1`` to ``lengths`` (each at most the current
        length), e.g. after a right-padded prefill of prompts of different lengths."""
        name = f"{type(self).__name__}.truncate"
        new = integer_values(name, "lengths", lengths).to(torch.int32)
        n = new.shape[0]
        if n > self.seqlens.shape[0]:
            raise ValueError(f"{name}: got {n} lengths for a cache of {self.seqlens.shape[0]} rows")
        cur = self.seqlens[:n].cpu()
        bad = ((new < 0) | (new > cur)).nonzero()
        if bad.numel():
            b = int(bad[0, 0])
            raise ValueError(f"{name}: lengths[{b}] = {int(new[b])} must be in [0, {int(cur[b])}] "
                             f"(the row's current length)")
        self.seqlens[:n].copy_(new.to(self.seqlens.device))

    @property
    def nbytes(self) -> int:
        """Bytes of the cache storage of all layers (the lengths and block table not counted)."""
        return sum(t.numel() * t.element_size() for t in self._storage())

    @property
    def bytes_per_token(self) -> int:
        """Cache bytes one token takes over all layers."""
        return sum(math.prod(t.shape[2:]) * t.element_size() for t in self._storage())

    @property
    def dtype(self) -> torch.dtype:
        return self._storage()[0].dtype

    @property
    def device(self) -> torch.device:
        return self._storage()[0].device

    def _check_layer(self, layer_idx: int) -> None:
        if not 0 <= layer_idx < self.num_layers:
            raise IndexError(f"{type(self).__name__}: layer_idx {layer_idx} is out of range "
                             f"[0, {self.num_layers})")


class _ContiguousRows:
    """What the contiguous caches share: ``batch_size`` rows of ``capacity`` tokens each."""

    def _init_rows(self, num_layers: int, batch_size: int, capacity: int, device) -> None:
        self.num_layers = check_positive("num_layers", num_layers)
        self.batch_size = check_positive("batch_size", batch_size)
        self._capacity = check_positive("capacity", capacity)
        self.seqlens = torch.zeros(batch_size, dtype=torch.int32, device=device)

    @property
    def capacity(self) -> int:
        """Tokens each row can hold."""
        return self._capacity

    def _layout(self, layer_storage: Tuple[Tensor, ...], batch_size: int) -> Tuple[Tuple[Tensor, ...], None]:
        return tuple(self._rows(t, batch_size) for t in layer_storage), None
