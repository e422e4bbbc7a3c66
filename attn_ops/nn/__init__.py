"""Modules and KV-cache objects built on the attn_ops operators.

* :class:`GroupedQueryAttention`, :class:`MultiQueryAttention`, :class:`MultiHeadAttention`: causal
  self-attention with RoPE and HuggingFace-style projections (``q_proj``/``k_proj``/``v_proj``/
  ``o_proj``), for training (differentiable) and cached inference.
* :class:`MultiHeadLatentAttention`: DeepSeek-V2/V3 multi-head latent attention (HuggingFace
  ``DeepseekV3Attention`` parameter names), expanded K/V for training, absorbed form over a latent
  cache for inference.
* :class:`KVCache` (contiguous) and :class:`PagedKVCache` (paged, with a block allocator): the caches
  a multi-layer model passes to every attention layer during generation; :class:`LatentKVCache` and
  :class:`PagedLatentKVCache` are their MLA counterparts (one ``[c_kv ; k_pe]`` row per token). They,
  :class:`LinearAttentionState` and the errors ``OutOfBlocksError`` / ``OutOfSlotsError`` are defined in
  :mod:`attn_ops.caches` and re-exported here.
* :class:`LinformerSelfAttention`: Linformer (keys/values projected along the sequence, linear in T).
* :class:`AdditiveAttention`: Bahdanau attention on the fused additive_attention op.
* :class:`ColumnParallelLinear`, :class:`RowParallelLinear`, :class:`TensorParallelGroupedQueryAttention`,
  :class:`TensorParallelMultiHeadLatentAttention`: the tensor-parallel layers and modules
  (what :func:`attn_ops.tensor_parallel` returns), defined in :mod:`attn_ops.parallel`.
* :class:`LightningAttention`: MiniMax-Text-01's linear-attention layer (transformers'
  ``MiniMaxLightningAttention`` parameter names); :class:`LinearAttentionState` is its recurrent-state pool.
"""
from ..caches import (KVCache, LatentKVCache, LinearAttentionState, OutOfBlocksError, OutOfSlotsError,
                      PagedKVCache, PagedLatentKVCache)
from ..parallel.layers import (ColumnParallelLinear, RowParallelLinear, TensorParallelGroupedQueryAttention,
                               TensorParallelMultiHeadLatentAttention)
from .additive import AdditiveAttention
from .attention import GroupedQueryAttention, MultiHeadAttention, MultiQueryAttention
from .lightning import LightningAttention
from .linformer import LinformerSelfAttention
from .mla import MultiHeadLatentAttention

__all__ = [
    # modules
    "GroupedQueryAttention",
    "MultiQueryAttention",
    "MultiHeadAttention",
    "MultiHeadLatentAttention",
    "LightningAttention",
    "LinformerSelfAttention",
    "AdditiveAttention",
    # caches (attn_ops.caches)
    "KVCache",
    "PagedKVCache",
    "LatentKVCache",
    "PagedLatentKVCache",
    "OutOfBlocksError",
    "LinearAttentionState",
    "OutOfSlotsError",
    # tensor-parallel layers and modules (attn_ops.parallel)
    "ColumnParallelLinear",
    "RowParallelLinear",
    "TensorParallelGroupedQueryAttention",
    "TensorParallelMultiHeadLatentAttention",
]
