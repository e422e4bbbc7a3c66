"""What the GPU side of this build offers: whether CUDA kernels are compiled in, and which backend an
attention call on a CUDA tensor takes (one place to change when another backend, e.g. cuDNN, is routed to)."""
import torch


def cuda_kernels_compiled() -> bool:
    """Whether the library registered CUDA kernels (it does when it was built with nvcc: setup.py's
    ATTN_OPS_WITH_CUDA build)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("attn_ops::attention", "CUDA")


def gpu_attention_backend() -> str:
    """The backend that ``attn_ops.attention`` and the other attention ops run on a CUDA tensor."""
    if not cuda_kernels_compiled():
        return "none: this build has no CUDA kernels (a call on a CUDA tensor raises)"
    return "attn_ops' own CUDA kernels"
