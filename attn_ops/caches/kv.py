"""The K/V caches of the attention modules (:class:`attn_ops.nn.GroupedQueryAttention` and its MQA / MHA
forms): :class:`KVCache` (contiguous rows) and :class:`PagedKVCache` (paged, vLLM layout), per layer one
K and one V tensor."""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .. import _huge_pages
from .. import ops as _ops
from .._checks import check_positive
from ._base import _cache_scale, _CacheBase, _ContiguousRows, _per_layer
from ._paged import _PagedBase

__all__ = ["KVCache", "PagedKVCache"]


def _allocate_layers(num_layers: int, rows: Tuple[int, int], num_kv_heads: int, head_dim: int,
                     head_dim_v: Optional[int], dtype: torch.dtype, device) -> Tuple[List[Tensor], List[Tensor]]:
    """One K and one V tensor per layer, ``[*rows, num_kv_heads, head_dim(_v)]`` (rows: ``(batch, capacity)``
    or ``(num_blocks, block_size)``). On the CPU each is the ``.transpose(1, 2)`` view of a ``[rows[0],
    num_kv_heads, rows[1], head_dim(_v)]`` tensor: each KV head's rows of a batch row or block are then
    contiguous, which the decode kernel streams one head at a time. Elsewhere they are contiguous."""
    check_positive("num_kv_heads", num_kv_heads)
    check_positive("head_dim", head_dim)
    head_dim_v = head_dim if head_dim_v is None else check_positive("head_dim_v", head_dim_v)
    head_major = _huge_pages.resolve_device(device).type == "cpu"

    def layers(dim: int) -> List[Tensor]:
        if not head_major:
            return _per_layer(num_layers, (*rows, num_kv_heads, dim), dtype, device)
        storage = _per_layer(num_layers, (rows[0], num_kv_heads, rows[1], dim), dtype, device)
        return [t.transpose(1, 2) for t in storage]

    return layers(head_dim), layers(head_dim_v)


class _KVCacheBase(_CacheBase):
    """Storage of the K/V caches: per layer one K and one V tensor."""

    k: List[Tensor]
    v: List[Tensor]
    k_scale: Optional[Tensor]  # an 8-bit cache's dequantization scales (float32 [1] or [Hkv]), else None
    v_scale: Optional[Tensor]

    def _init_scales(self, k_scale, v_scale) -> None:
        self.k_scale = _cache_scale("k_scale", k_scale, self.k[0].dtype, self.num_kv_heads, self.k[0].device)
        self.v_scale = _cache_scale("v_scale", v_scale, self.k[0].dtype, self.num_kv_heads, self.k[0].device)

    def _storage(self) -> List[Tensor]:
        return self.k + self.v

    @property
    def num_kv_heads(self) -> int:
        return self.k[0].shape[-2]

    @property
    def head_dim(self) -> int:
        return self.k[0].shape[-1]

    @property
    def head_dim_v(self) -> int:
        return self.v[0].shape[-1]

    def attend(self, layer_idx: int, q: Tensor, *, scale: Optional[float] = None,
               window_left: int = -1, softcap: float = 0.0, sinks: Optional[Tensor] = None,
               attention_chunk: int = 0, alibi_slopes: Optional[Tensor] = None) -> Tensor:
        """Causal attention of ``q [B, T, Hq, D]`` (the ``T`` tokens just appended) over layer
        ``layer_idx``'s cache: ``[B, T, Hq, Dv]``; ``sinks`` / ``attention_chunk`` / ``alibi_slopes`` as
        :func:`attn_ops.attention_with_kvcache`'s (chunks at cache positions)."""
        self._check_layer(layer_idx)
        B, T = q.shape[0], q.shape[1]
        (k, v), block_table = self._layout((self.k[layer_idx], self.v[layer_idx]), B)
        out, _ = _ops.attention_with_kvcache(q, k, v, self._rows(self.seqlens, B) + T, block_table=block_table,
                                             scale=scale, causal=True, window_left=window_left, softcap=softcap,
                                             sinks=sinks, attention_chunk=attention_chunk,
                                             alibi_slopes=alibi_slopes, k_scale=self.k_scale, v_scale=self.v_scale)
        return out


class KVCache(_ContiguousRows, _KVCacheBase):
    """KV cache of ``capacity`` tokens per row (not paged): per layer ``k [batch_size, capacity, Hkv, D]``,
    ``v [.., Dv]`` (one allocation per layer and per tensor), and ``seqlens`` (``int32 [batch_size]``).

    Args:
        num_layers: how many attention layers share the cache (``layer_idx`` in ``0 .. num_layers-1``;
            the last one advances the lengths).
        batch_size: rows; a forward may use the first ``B <= batch_size`` of them.
        capacity: tokens per row. Appending past it raises the op's ``RuntimeError``
            ("... exceeds the cache capacity ...") before anything is written.
        num_kv_heads, head_dim: the KV heads and head dim of the layers; ``head_dim_v`` defaults to
            ``head_dim``.

    8-bit caches: ``dtype=torch.float8_e4m3fn`` (or ``torch.float8_e5m2``) stores each value as
    ``saturate(x / k_scale)`` (``v_scale``) in one byte, half the bytes of a bfloat16 cache, and attention reads
    ``stored * scale``; the scales (a float or a float32 tensor of one value or one per KV head, default 1) are
    kept as ``k_scale`` / ``v_scale`` tensors on the cache's device: update them in place to recalibrate.
    Pick them so that ``|x| / scale`` stays within the format's range (448 for e4m3fn, 57344 for e5m2).

    The sliding window of a module does not shrink the cache: it must hold the whole sequence. On a Linux
    CPU the storage is in transparent huge pages, as in every cache here (attn_ops/_huge_pages.py).

    On the CPU, ``k[layer]`` / ``v[layer]`` are the ``.transpose(1, 2)`` views of ``[batch_size, Hkv,
    capacity, D]`` tensors (same shape and values, other strides): each KV head's rows are then contiguous,
    and the decode kernel streams every head in address order (1.25-1.3x faster than the same huge pages
    in the [batch_size, capacity, Hkv, D] order at B=32 on the README's Zen 4, "CPU decode"). Elsewhere
    they are contiguous.
    """

    def __init__(self, num_layers: int, batch_size: int, capacity: int, num_kv_heads: int,
                 head_dim: int, *, head_dim_v: Optional[int] = None,
                 dtype: torch.dtype = torch.float32, device=None, k_scale=None, v_scale=None):
        self._init_rows(num_layers, batch_size, capacity, device)
        self.k, self.v = _allocate_layers(num_layers, (batch_size, capacity), num_kv_heads, head_dim,
                                          head_dim_v, dtype, device)
        self._init_scales(k_scale, v_scale)

    def append(self, layer_idx: int, k: Tensor, v: Tensor) -> None:
        """Write ``k [B, T, Hkv, D]`` / ``v [B, T, Hkv, Dv]`` of layer ``layer_idx`` at the current
        lengths of rows ``0 .. B-1`` (the lengths are not changed)."""
        self._check_layer(layer_idx)
        B = k.shape[0]
        _ops.kv_cache_append(self._rows(self.k[layer_idx], B), self._rows(self.v[layer_idx], B), k, v,
                             self._rows(self.seqlens, B), k_scale=self.k_scale, v_scale=self.v_scale)

    def __repr__(self) -> str:
        return (f"KVCache(num_layers={self.num_layers}, batch_size={self.batch_size}, "
                f"capacity={self.capacity}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, dtype={self.dtype}, device={self.device}, "
                f"nbytes={self.nbytes})")


class PagedKVCache(_PagedBase, _KVCacheBase):
    """Paged KV cache (vLLM layout) with a host-side block allocator.

    Per layer ``k [num_blocks, block_size, Hkv, D]`` / ``v [.., Dv]``; ``block_table``
    (``int32 [batch_size, max_blocks_per_seq]``): token ``p`` of row ``b`` lives in block
    ``block_table[b, p // block_size]`` at offset ``p % block_size``; entries not assigned hold
    ``num_blocks`` (out of range, so an append the allocator did not reserve for raises the op's
    ``RuntimeError`` and writes nothing). All layers share one block table.

    Before each step (outside compiled code) call :meth:`reserve` with the number of tokens the step
    adds; it assigns the blocks the rows need, round-robin over the rows (row 0's next block, row 1's
    next block, ...), so rows that grow together get interleaved, non-contiguous blocks. Freed blocks
    go to the back of the free list. Raises :class:`OutOfBlocksError` (a ``RuntimeError``) when the free
    blocks do not suffice, and ``RuntimeError`` when a row would need more than ``max_blocks_per_seq``
    blocks; in both cases nothing is assigned. 8-bit caches (``dtype``, ``k_scale``, ``v_scale``) as
    :class:`KVCache`.

    ``batch_size``: rows of the block table; a forward may use the first ``B <= batch_size``.

    On the CPU, ``k[layer]`` / ``v[layer]`` are the ``.transpose(1, 2)`` views of ``[num_blocks, Hkv,
    block_size, D]`` tensors (same shape and values, other strides): within a block each KV head's rows are
    contiguous, and the decode kernel streams one head at a time (1.05-1.37x faster at block sizes 4-256 on
    the README's Zen 4, "CPU decode"). Elsewhere they are contiguous.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, batch_size: int, max_blocks_per_seq: int, *,
                 head_dim_v: Optional[int] = None, dtype: torch.dtype = torch.float32, device=None,
                 k_scale=None, v_scale=None):
        self._init_paged(num_layers, num_blocks, block_size, batch_size, max_blocks_per_seq, device)
        self.k, self.v = _allocate_layers(num_layers, (num_blocks, block_size), num_kv_heads, head_dim,
                                          head_dim_v, dtype, device)
        self._init_scales(k_scale, v_scale)

    def append(self, layer_idx: int, k: Tensor, v: Tensor) -> None:
        """Write ``k [B, T, Hkv, D]`` / ``v [B, T, Hkv, Dv]`` of layer ``layer_idx`` after the current
        lengths of rows ``0 .. B-1`` (the lengths are not changed)."""
        self._check_layer(layer_idx)
        B, T = k.shape[0], k.shape[1]
        slots = self.slot_mapping(B, T)
        self._write(lambda: _ops.paged_kv_cache_append(self.k[layer_idx], self.v[layer_idx], k.flatten(0, 1),
                                                       v.flatten(0, 1), slots, k_scale=self.k_scale,
                                                       v_scale=self.v_scale), T)

    def __repr__(self) -> str:
        return (f"PagedKVCache(num_layers={self.num_layers}, num_blocks={self.num_blocks}, "
                f"block_size={self.block_size}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, batch_size={self.batch_size}, "
                f"max_blocks_per_seq={self.max_blocks_per_seq}, dtype={self.dtype}, "
                f"device={self.device}, free_blocks={self.num_free_blocks})")
