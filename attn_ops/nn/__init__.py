"""Modules and KV-cache objects built on the attn_ops operators.

* :class:`GroupedQueryAttention`, :class:`MultiQueryAttention`, :class:`MultiHeadAttention`: causal
  self-attention with RoPE and HuggingFace-style projections (``q_proj``/``k_proj``/``v_proj``/
  ``o_proj``), for training (differentiable) and cached inference.
* :class:`KVCache` (contiguous) and :class:`PagedKVCache` (paged, with a block allocator): the caches
  a multi-layer model passes to every attention layer during generation.
"""
from .attention import GroupedQueryAttention, MultiHeadAttention, MultiQueryAttention
from .cache import KVCache, OutOfBlocksError, PagedKVCache

__all__ = [
    "GroupedQueryAttention",
    "MultiQueryAttention",
    "MultiHeadAttention",
    "KVCache",
    "PagedKVCache",
    "OutOfBlocksError",
]
