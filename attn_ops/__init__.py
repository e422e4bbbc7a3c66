"""attn_ops: MQA / GQA / MLA attention and KV-cache operators for PyTorch.

Importing the package loads the compiled operator library, which registers ``torch.ops.attn_ops.*``
(CPU kernels always, CUDA kernels when built with nvcc), their autograd and their Meta (fake) kernels.
"""
import torch  # noqa: F401  (the operator library links against torch's libraries)

from . import _C  # noqa: F401  (registers the operators)
from . import ghost_attention, nn, parallel
from .parallel import merge_attention_partials, tensor_parallel
from .ops import (
    additive_attention,
    attention,
    attention_backward,
    attention_with_kvcache,
    kv_cache_append,
    lightning_attention,
    lightning_attention_decode_,
    mla_cache_append,
    mla_decode,
    paged_kv_cache_append,
    rotary_cos_sin,
    rotary_embedding,
    rotary_embedding_,
)

__all__ = [
    "nn",
    "parallel",
    "ghost_attention",
    "additive_attention",
    "merge_attention_partials",
    "tensor_parallel",
    "attention",
    "attention_backward",
    "attention_with_kvcache",
    "kv_cache_append",
    "lightning_attention",
    "lightning_attention_decode_",
    "mla_cache_append",
    "mla_decode",
    "paged_kv_cache_append",
    "rotary_cos_sin",
    "rotary_embedding",
    "rotary_embedding_",
]
__version__ = "0.1.0"

# FlashAttention-2-compatible functions (docs/flash_attn_compat.md).
from . import flash_attn_interface  # noqa: E402

__all__ += ["flash_attn_interface"]

# The backward ops of the additive and lightning families (every schema reachable from Python).
from .ops import additive_attention_backward, lightning_attention_backward  # noqa: E402

__all__ += ["additive_attention_backward", "lightning_attention_backward"]
