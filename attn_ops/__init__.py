"""attn_ops: MQA / GQA / MLA attention and KV-cache operators for PyTorch.

Importing the package loads the compiled operator library, which registers ``torch.ops.attn_ops.*``
(CPU kernels always, CUDA kernels when built with nvcc), their autograd and their Meta (fake) kernels.
"""
import torch  # noqa: F401  (the operator library links against torch's libraries)

from . import _C  # noqa: F401  (registers the operators)
from .ops import attention, attention_backward

__all__ = ["attention", "attention_backward"]
__version__ = "0.1.0"
