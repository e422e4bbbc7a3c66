"""attn_ops: MQA / GQA / MLA attention and KV-cache operators for PyTorch.

Importing the package loads the compiled operator library, which registers ``torch.ops.attn_ops.*``
(CPU kernels always, CUDA kernels when built with nvcc), their autograd and their Meta (fake) kernels.

* The operators: one Python wrapper per registered op (:mod:`attn_ops.ops`), all exported here.
* :mod:`attn_ops.nn`: the attention modules; it re-exports the caches and the tensor-parallel types.
* :mod:`attn_ops.caches`: the KV and latent caches and the linear-attention state.
* :mod:`attn_ops.parallel`: tensor parallelism and merging attention over key shards
  (:func:`tensor_parallel` and :func:`merge_attention_partials` are exported here).
* :mod:`attn_ops.ghost_attention`: Ghost Attention (GAtt) fine-tuning data helpers.
* :mod:`attn_ops.flash_attn_interface`: FlashAttention-2-compatible functions (docs/flash_attn_compat.md).

Imported on demand only: :mod:`attn_ops.flash_attn3_interface`, :mod:`attn_ops.flash_attn_shim`, and
:mod:`attn_ops.integrations` (which needs transformers).
"""
import torch  # noqa: F401  (the operator library links against torch's libraries)

from . import _C  # noqa: F401  (registers the operators; before anything calls them)
from . import caches, flash_attn_interface, ghost_attention, nn, ops, parallel
from .ops import (
    additive_attention,
    additive_attention_backward,
    attention,
    attention_backward,
    attention_with_kvcache,
    kv_cache_append,
    lightning_attention,
    lightning_attention_backward,
    lightning_attention_decode_,
    mla_cache_append,
    mla_decode,
    paged_kv_cache_append,
    alibi_slopes,
    rotary_cos_sin,
    rotary_embedding,
    rotary_embedding_,
)
from .parallel import merge_attention_partials, tensor_parallel

__version__ = "0.1.0"

__all__ = [
    # subpackages and modules
    "caches",
    "flash_attn_interface",
    "ghost_attention",
    "nn",
    "ops",
    "parallel",
    # operators
    "additive_attention",
    "additive_attention_backward",
    "attention",
    "attention_backward",
    "attention_with_kvcache",
    "kv_cache_append",
    "lightning_attention",
    "lightning_attention_backward",
    "lightning_attention_decode_",
    "mla_cache_append",
    "mla_decode",
    "paged_kv_cache_append",
    "alibi_slopes",
    "rotary_cos_sin",
    "rotary_embedding",
    "rotary_embedding_",
    # parallel attention
    "merge_attention_partials",
    "tensor_parallel",
]
