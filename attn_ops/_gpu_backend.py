"""What the GPU side of this build offers: whether CUDA kernels are compiled in, and which backend an
attention call on a CUDA tensor takes (the router in csrc/attention/cuda/backend_route.h decides per call)."""
import os

import torch


def cuda_kernels_compiled() -> bool:
    """Whether the library registered CUDA kernels (it does when it was built with nvcc: setup.py's
    ATTN_OPS_WITH_CUDA build)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("attn_ops::attention", "CUDA")


def cudnn_backend_compiled() -> bool:
    """Whether the CUDA build has the cuDNN attention backend (cudnn-frontend headers found at build time)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("attn_ops::_cudnn_validate_attention",
                                                           "CompositeExplicitAutograd")


def gpu_attention_backend() -> str:
    """The backends that ``attn_ops.attention`` and the other attention ops run on a CUDA tensor."""
    if not cuda_kernels_compiled():
        return "none: this build has no CUDA kernels (a call on a CUDA tensor raises)"
    if not cudnn_backend_compiled():
        return "attn_ops' own CUDA kernels (this build has no cuDNN backend)"
    forced = os.environ.get("ATTN_OPS_ATTENTION_BACKEND", "auto") or "auto"
    return (f"cuDNN's fused attention where the router allows it (compute capability 9.0, cuDNN 9.19 / 9.24, "
            f"docs/cuda.md), attn_ops' own kernels elsewhere; ATTN_OPS_ATTENTION_BACKEND={forced}")
