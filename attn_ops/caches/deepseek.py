"""A transformers ``Cache`` of latent rows for DeepSeek-V2/V3 models swapped to attn_ops MLA.

:class:`DeepseekLatentCache` holds, per decoder layer, one :class:`attn_ops.nn.LatentKVCache` (one
``[c_kv ; k_pe]`` row of ``kv_lora_rank + qk_rope_head_dim`` values per token) that the attention
modules of :func:`attn_ops.integrations.deepseek.swap_deepseek_attention` append to and attend over
(absorbed MLA). It answers transformers' questions (``get_seq_length``, ``get_mask_sizes``,
``reorder_cache`` for beam search, ``crop`` for assisted decoding, ``reset``), so
``model.generate(..., past_key_values=DeepseekLatentCache(model.config))`` works; the swapped model
also makes one by itself wherever transformers would make a ``DynamicCache``.

Sequence lengths: ``get_seq_length()`` is the number of token slots seen, padding included (what
transformers counts); each batch row of the attn_ops cache holds only its real tokens (left padding
is dropped when written), so row ``b``'s length is ``seq_length - padding_b``.

This module imports transformers: :mod:`attn_ops.caches` does not import it, and users import
:class:`DeepseekLatentCache` from :mod:`attn_ops.integrations.deepseek`.
"""
from __future__ import annotations

from typing import List, Optional

import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin

from .latent import LatentKVCache

__all__ = ["DeepseekLatentCache"]

_FILLED_BY_SWAPPED_MODULES = (
    "DeepseekLatentCache is written by the attention modules of "
    "attn_ops.integrations.deepseek.swap_deepseek_attention only; an unswapped attention layer called "
    "{}() on it (swap the model's attention first, or use a transformers DynamicCache)")


class _LatentLayer(CacheLayerMixin):
    """One decoder layer's latent rows: a :class:`LatentKVCache` with ``num_layers=1`` (allocated at the
    first write, for that write's batch size, dtype and device; its capacity doubles when full) and
    ``seen``, the token slots written so far (padding included)."""

    is_croppable = True
    supports_early_init = False

    def __init__(self, kv_lora_rank: int, rope_dim: int, min_capacity: int, cache_dtype: Optional[torch.dtype] = None,
                 kv_scale=None):
        super().__init__()
        self.kv_lora_rank, self.rope_dim, self.min_capacity = kv_lora_rank, rope_dim, min_capacity
        self.cache_dtype, self.kv_scale = cache_dtype, kv_scale
        self.latent: Optional[LatentKVCache] = None
        self.seen = 0

    # ---- what transformers calls -------------------------------------------------------------
    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        raise TypeError(_FILLED_BY_SWAPPED_MODULES.format("lazy_initialization"))

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs):
        raise TypeError(_FILLED_BY_SWAPPED_MODULES.format("update"))

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int):
        return self.seen + query_length, 0

    def get_max_length(self) -> int:
        return -1  # grows on demand

    def reset(self) -> None:
        self.seen = 0
        if self.latent is not None:
            self.latent.reset()

    def reorder_cache(self, beam_idx: Tensor) -> None:
        """Row ``b`` becomes row ``beam_idx[b]`` (beam search)."""
        if self.latent is not None:
            idx = beam_idx.to(self.latent.device)
            for t in (self.latent.latent[0], self.latent.seqlens):
                t.copy_(t.index_select(0, idx))

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last tokens of every row: ``-n`` drops ``n``; a positive value is the length to
        keep (transformers' older form)."""
        n = -tokens_to_remove if tokens_to_remove <= 0 else self.seen - tokens_to_remove
        n = min(max(n, 0), self.seen)
        if n and self.latent is not None:
            self.latent.seqlens.sub_(n).clamp_(min=0)
        self.seen -= n

    # ---- what the swapped attention calls ----------------------------------------------------
    def reserve(self, batch_size: int, num_new: int, dtype: torch.dtype,
                device: torch.device) -> LatentKVCache:
        """The layer's :class:`LatentKVCache`, with room for ``num_new`` more token slots per row."""
        need = self.seen + num_new
        old = self.latent
        dtype = self.cache_dtype or dtype  # the storage's
        if old is not None and (old.batch_size, old.dtype, old.device) != (batch_size, dtype, device):
            if self.seen:
                raise ValueError(
                    f"DeepseekLatentCache: the inputs have batch size {batch_size}, dtype {dtype}, device "
                    f"{device}; the cache holds {self.seen} tokens of batch size {old.batch_size}, dtype "
                    f"{old.dtype}, device {old.device} (reset() it or make a new one)")
            old = None  # empty: nothing to keep
        elif old is not None and need <= old.capacity:
            return old
        capacity = max(need, self.min_capacity, 2 * old.capacity if old is not None else 0)
        new = LatentKVCache(1, batch_size, capacity, self.kv_lora_rank, self.rope_dim, dtype=dtype,
                            device=device, kv_scale=self.kv_scale)
        if old is not None:
            new.latent[0][:, :old.capacity].copy_(old.latent[0])
            new.seqlens.copy_(old.seqlens)
        self.latent = new
        return new

    def commit(self, num_new: int, padding: Optional[Tensor]) -> None:
        """After the attention appended ``num_new`` slots to every row (and advanced the lengths by
        ``num_new``): count them, and take each row's ``padding`` (int32 ``[B]``) back off its length."""
        self.seen += num_new
        if padding is not None:
            self.latent.seqlens.sub_(padding)

    @property
    def bytes_per_token(self) -> int:
        return 0 if self.latent is None else self.latent.bytes_per_token


class DeepseekLatentCache(Cache):
    """transformers ``Cache`` for DeepSeek-V2/V3 models swapped by
    :func:`attn_ops.integrations.deepseek.swap_deepseek_attention`: per decoder layer one
    :class:`attn_ops.nn.LatentKVCache` of ``[c_kv ; k_pe]`` rows.

    Args:
        config: the model's config (``num_hidden_layers``, ``kv_lora_rank``, ``qk_rope_head_dim``).
        max_cache_len: optional first capacity in tokens per row (e.g. prompt length +
            ``max_new_tokens``), so that generation never reallocates; by default the first write
            sizes it and it doubles whenever full.
        dtype: the rows' dtype; by default the model's. ``torch.float8_e4m3fn`` / ``torch.float8_e5m2``
            store one byte per value (CPU), with ``kv_scale`` (a float or a one-value float32 tensor, every
            layer; default 1) as :class:`attn_ops.caches.LatentKVCache`.

    Batch size, dtype and device come from the first forward; a later forward must match them while
    the cache holds tokens (``reset()`` empties it). ``bytes_per_token`` sums the layers' latent row
    bytes: ``num_hidden_layers * (kv_lora_rank + qk_rope_head_dim) * element_size``.
    """

    def __init__(self, config, max_cache_len: Optional[int] = None, *, dtype: Optional[torch.dtype] = None,
                 kv_scale=None):
        if max_cache_len is not None and (not isinstance(max_cache_len, int)
                                          or isinstance(max_cache_len, bool) or max_cache_len < 1):
            raise ValueError(f"max_cache_len must be None or an int >= 1, got {max_cache_len!r}")
        config = config.get_text_config(decoder=True)
        layers: List[CacheLayerMixin] = [
            _LatentLayer(config.kv_lora_rank, config.qk_rope_head_dim, max_cache_len or 1, dtype, kv_scale)
            for _ in range(config.num_hidden_layers)]
        super().__init__(layers=layers)

    @property
    def bytes_per_token(self) -> int:
        """Cache bytes one token takes over all layers (0 before the first forward)."""
        return sum(layer.bytes_per_token for layer in self.layers)

    def __repr__(self) -> str:
        return (f"DeepseekLatentCache(num_layers={len(self.layers)}, seq_length={self.get_seq_length()}, "
                f"bytes_per_token={self.bytes_per_token})")
