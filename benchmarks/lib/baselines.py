"""The plain-PyTorch baselines several benchmarks compare against (HuggingFace's repeat_kv + eager
attention, compiled FlexAttention, SDPA restricted to one backend) and their inputs (seeded random
tensors, paged copies of dense caches, the relative difference of two results)."""

from __future__ import annotations



import torch


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """HuggingFace's repeat_kv: [B, Hkv, T, D] -> [B, Hkv * n_rep, T, D] (a copy)."""
    b, hkv, t, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, hkv, n_rep, t, d).reshape(b, hkv * n_rep, t, d)


def eager_attention(q, k, v, mask, scale):
    """HuggingFace's eager_attention_forward (dropout 0), on [B, H, T, D] tensors: repeat_kv,
    q @ k^T * scale, + additive mask, softmax in float32, cast back, @ v."""
    n_rep = q.shape[1] // k.shape[1]
    k = repeat_kv(k, n_rep)
    v = repeat_kv(v, n_rep)
    w = torch.matmul(q, k.transpose(2, 3)) * scale
    if mask is not None:
        w = w + mask
    w = torch.nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(w, v)


_FLEX = {}


def flex_compiled():
    """torch.compile(flex_attention) (one handle per process; every new shape recompiles)."""
    if "fn" not in _FLEX:
        from torch.nn.attention.flex_attention import flex_attention

        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 1024)
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX["fn"]


SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}


def sdpa_backend(name: str):
    """The context manager that restricts SDPA to one backend ("flash", "cudnn", "efficient",
    "math"), torch.nn.attention.sdpa_kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[name]))


def randn(shape, dtype, device, generator: torch.Generator) -> torch.Tensor:
    """Random normal values drawn on `device` with a generator of that device (large caches are
    drawn on the GPU, not copied from the host)."""
    return torch.randn(*shape, generator=generator, device=device, dtype=dtype)


def generator(device: str, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def paged_copies(dense: list[torch.Tensor], block_size: int, generator: torch.Generator,
                 extra_blocks: int = 2) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Paged copies of the caches in `dense` (each [B, capacity, ...], capacity a multiple of
    block_size): (pools [num_blocks, block_size, ...], one per cache, holding the blocks in one
    shuffled order with `extra_blocks` unused ones, and their block_table int32
    [B, capacity // block_size])."""
    b, cap = dense[0].shape[:2]
    nb = cap // block_size
    num_blocks = b * nb + extra_blocks
    perm = torch.randperm(num_blocks, generator=generator, device=dense[0].device)[:b * nb]
    pools = []
    for x in dense:
        pool = torch.empty(num_blocks, block_size, *x.shape[2:], dtype=x.dtype, device=x.device)
        pool[perm] = x.reshape(b * nb, block_size, *x.shape[2:])
        pools.append(pool)
    return pools, perm.reshape(b, nb).to(torch.int32)


def rel_maxdiff(a: torch.Tensor, ref: torch.Tensor) -> float:
    """max |a - ref| / max |ref| (0 for empty tensors)."""
    if a.numel() == 0:
        return 0.0
    a, ref = a.float(), ref.float()
    return float((a - ref).abs().max()) / max(float(ref.abs().max()), 1e-30)
