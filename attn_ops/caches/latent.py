"""The caches of multi-head latent attention (DeepSeek-V2/V3 MLA, :class:`attn_ops.nn.MultiHeadLatentAttention`):
:class:`LatentKVCache` (contiguous rows) and :class:`PagedLatentKVCache` (paged), one ``[c_kv ; k_pe]``
row per token and layer, shared by all heads."""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .. import ops as _ops
from .._checks import check_positive
from ._base import _cache_scale, _CacheBase, _ContiguousRows, _per_layer
from ._paged import _PagedBase

__all__ = ["LatentKVCache", "PagedLatentKVCache"]


class _LatentCacheBase(_CacheBase):
    """Storage of the MLA caches: per layer one tensor whose rows are ``[c_kv ; k_pe]``
    (``kv_lora_rank + rope_dim`` values per token, shared by all heads; docs/mla_api.md)."""

    latent: List[Tensor]
    kv_scale: Optional[Tensor]  # an 8-bit cache's dequantization scale (float32 [1]), else None
    _kv_lora_rank: int

    def _init_latent(self, rows: Tuple[int, int], kv_lora_rank: int, rope_dim: int,
                     dtype: torch.dtype, device, kv_scale) -> None:
        self._kv_lora_rank = check_positive("kv_lora_rank", kv_lora_rank)
        check_positive("rope_dim", rope_dim)
        self.latent = _per_layer(self.num_layers, (*rows, kv_lora_rank + rope_dim), dtype, device)
        self.kv_scale = _cache_scale("kv_scale", kv_scale, dtype, 1, self.latent[0].device)

    def _storage(self) -> List[Tensor]:
        return self.latent

    @property
    def kv_lora_rank(self) -> int:
        """``d_c``: the first ``d_c`` values of a row are ``c_kv`` (keys and values in latent space)."""
        return self._kv_lora_rank

    @property
    def rope_dim(self) -> int:
        """``d_rope``: the last values of a row are the rotated, head-shared ``k_pe``."""
        return self.latent[0].shape[-1] - self._kv_lora_rank

    def attend(self, layer_idx: int, q_latent: Tensor, q_rope: Tensor, *, scale: float) -> Tensor:
        """Absorbed causal attention (:func:`attn_ops.mla_decode`) of ``q_latent [B, T, H, d_c]`` /
        ``q_rope [B, T, H, d_rope]`` (the ``T`` tokens just appended) over layer ``layer_idx``'s cache:
        ``out_latent [B, T, H, d_c]``."""
        self._check_layer(layer_idx)
        B, T = q_latent.shape[0], q_latent.shape[1]
        (latent,), block_table = self._layout((self.latent[layer_idx],), B)
        out, _ = _ops.mla_decode(q_latent, q_rope, latent, self._rows(self.seqlens, B) + T, scale=scale,
                                 block_table=block_table, kv_scale=self.kv_scale)
        return out

    def _repr_dims(self) -> str:
        return (f"kv_lora_rank={self.kv_lora_rank}, rope_dim={self.rope_dim}, dtype={self.dtype}, "
                f"device={self.device}, bytes_per_token={self.bytes_per_token}")


class LatentKVCache(_ContiguousRows, _LatentCacheBase):
    """Contiguous MLA cache: per layer ``latent [batch_size, capacity, kv_lora_rank + rope_dim]``
    (row ``[c_kv ; k_pe]``: the normalized latent ``c_kv`` and the rotated ``k_pe`` of each token) and
    ``seqlens`` (``int32 [batch_size]``), used by :class:`attn_ops.nn.MultiHeadLatentAttention`.

    ``dtype`` / ``device`` are keyword-only. ``bytes_per_token`` is
    ``num_layers * (kv_lora_rank + rope_dim) * element_size``, against
    ``num_layers * num_heads * (qk_nope + qk_rope + v_head_dim) * element_size`` for a K/V cache of the
    expanded heads (576 vs 40960 values per layer at DeepSeek-V3 size). Lengths, ``advance``,
    ``truncate``, ``free_rows``, ``reset`` as :class:`KVCache`. ``dtype=torch.float8_e4m3fn`` (or
    ``torch.float8_e5m2``) stores the rows in one byte per value with the scale ``kv_scale`` (a float or a
    one-value float32 tensor, default 1; every column, ``c_kv`` and ``k_pe`` alike), as :class:`KVCache`.
    """

    def __init__(self, num_layers: int, batch_size: int, capacity: int, kv_lora_rank: int,
                 rope_dim: int, *, dtype: torch.dtype = torch.float32, device=None, kv_scale=None):
        self._init_rows(num_layers, batch_size, capacity, device)
        self._init_latent((batch_size, capacity), kv_lora_rank, rope_dim, dtype, device, kv_scale)

    def append(self, layer_idx: int, c_kv: Tensor, k_pe: Tensor) -> None:
        """Write ``c_kv [B, T, d_c]`` / ``k_pe [B, T, d_rope]`` of layer ``layer_idx`` at the current
        lengths of rows ``0 .. B-1`` (the lengths are not changed)."""
        self._check_layer(layer_idx)
        B = c_kv.shape[0]
        _ops.mla_cache_append(self._rows(self.latent[layer_idx], B), c_kv, k_pe,
                              cache_seqlens=self._rows(self.seqlens, B), kv_scale=self.kv_scale)

    def __repr__(self) -> str:
        return (f"LatentKVCache(num_layers={self.num_layers}, batch_size={self.batch_size}, "
                f"capacity={self.capacity}, {self._repr_dims()})")


class PagedLatentKVCache(_PagedBase, _LatentCacheBase):
    """Paged MLA cache: per layer ``latent [num_blocks, block_size, kv_lora_rank + rope_dim]``, with
    the block table and host-side allocator of :class:`PagedKVCache` (``reserve`` before each step,
    ``free_rows``, ``truncate``, ``reset``, :class:`OutOfBlocksError`). Any block size. ``dtype`` /
    ``device`` are keyword-only; 8-bit caches (``dtype``, ``kv_scale``) as :class:`LatentKVCache`."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, kv_lora_rank: int,
                 rope_dim: int, batch_size: int, max_blocks_per_seq: int, *,
                 dtype: torch.dtype = torch.float32, device=None, kv_scale=None):
        self._init_paged(num_layers, num_blocks, block_size, batch_size, max_blocks_per_seq, device)
        self._init_latent((num_blocks, block_size), kv_lora_rank, rope_dim, dtype, device, kv_scale)

    def append(self, layer_idx: int, c_kv: Tensor, k_pe: Tensor) -> None:
        """Write ``c_kv [B, T, d_c]`` / ``k_pe [B, T, d_rope]`` of layer ``layer_idx`` after the current
        lengths of rows ``0 .. B-1`` (the lengths are not changed)."""
        self._check_layer(layer_idx)
        B, T = c_kv.shape[0], c_kv.shape[1]
        slots = self.slot_mapping(B, T)
        self._write(lambda: _ops.mla_cache_append(self.latent[layer_idx], c_kv.flatten(0, 1), k_pe.flatten(0, 1),
                                                  slot_mapping=slots, kv_scale=self.kv_scale), T)

    def __repr__(self) -> str:
        return (f"PagedLatentKVCache(num_layers={self.num_layers}, num_blocks={self.num_blocks}, "
                f"block_size={self.block_size}, batch_size={self.batch_size}, "
                f"max_blocks_per_seq={self.max_blocks_per_seq}, free_blocks={self.num_free_blocks}, "
                f"{self._repr_dims()})")
