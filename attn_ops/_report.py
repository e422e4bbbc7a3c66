"""The facts ``python -m attn_ops`` reports: versions, what the build compiled (CUDA kernels and their
architectures), the GPUs and the CPU, and which kernels an op call will take on this machine."""
from dataclasses import dataclass
from typing import List

import torch

from . import _C, __version__
from ._cpu_isa import amx_bf16_use, avx512_bf16_use, choose_isa, cpu_flags, cpu_model_name
from ._fatbin import cuda_architectures
from ._gpu_backend import cuda_kernels_compiled, gpu_attention_backend


@dataclass(frozen=True)
class Fact:
    """One reported fact: ``key`` and ``value`` for --json (value is JSON-serializable), ``label`` and ``text``
    for the text report."""

    key: str
    label: str
    value: object
    text: str


def _cudnn_version():
    """cuDNN's version number as torch reports it, or None where torch has no cuDNN."""
    try:
        return torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except RuntimeError:  # a cuDNN library that torch finds but cannot load
        return None


def _cudnn_text(version) -> str:
    """cuDNN's version number in words: 9.x numbers it 10000 * major + 100 * minor + patch, 8.x with 1000."""
    if version is None:
        return "not available"
    major_unit = 10000 if version >= 90000 else 1000
    return f"{version // major_unit}.{version % major_unit // 100}.{version % 100}"


def _gpus() -> List[dict]:
    """Name and compute capability of each GPU torch sees."""
    if not torch.cuda.is_available():
        return []
    gpus = []
    for index in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(index)
        gpus.append({"name": torch.cuda.get_device_name(index), "compute_capability": f"{major}.{minor}"})
    return gpus


def _architecture_facts(library: str) -> List[Fact]:
    """Whether CUDA kernels are compiled in, and for which architectures."""
    if not cuda_kernels_compiled():
        return [Fact("cuda_kernels", "CUDA kernels", False, "not compiled (a CPU-only build)")]
    archs = cuda_architectures(library)
    arch_text = ", ".join(archs) if archs else "not recorded by this build"
    return [Fact("cuda_kernels", "CUDA kernels", True, "compiled"),
            Fact("cuda_architectures", "CUDA architectures", archs, arch_text)]


def _cpu_facts() -> List[Fact]:
    """The CPU, the instruction-set copy of the kernels, and AVX512-BF16 / AMX."""
    flags, model = cpu_flags(), cpu_model_name()
    facts = [Fact("cpu", "CPU", model, model),
             Fact("cpu_threads", "CPU threads (torch)", torch.get_num_threads(), str(torch.get_num_threads()))]
    try:
        choice = choose_isa()
    except ValueError as error:
        return facts + [Fact("cpu_isa", "CPU kernel copy", None, f"none: {error}")]
    bf16, amx = avx512_bf16_use(choice.isa, flags), amx_bf16_use(choice.isa, flags)
    return facts + [Fact("cpu_isa", "CPU kernel copy", choice.isa, f"{choice.isa} ({choice.reason})"),
                    Fact("avx512_bf16", "AVX512-BF16", bf16, bf16),
                    Fact("amx_bf16", "AMX-BF16", amx, amx)]


def collect_facts() -> List[Fact]:
    """Every fact of the report, in the order printed."""
    library = _C.__file__
    cudnn = _cudnn_version()
    gpus = _gpus()
    gpu_text = "; ".join(f"{g['name']} (compute capability {g['compute_capability']})" for g in gpus)
    return [
        Fact("attn_ops", "attn_ops", __version__, __version__),
        Fact("library", "library", library, library),
        Fact("torch", "torch", torch.__version__, torch.__version__),
        Fact("torch_cuda", "torch CUDA", torch.version.cuda, torch.version.cuda or "none (a CPU-only torch)"),
        Fact("cudnn", "cuDNN", cudnn, _cudnn_text(cudnn)),
        *_architecture_facts(library),
        Fact("gpus", "GPUs", gpus, gpu_text or "none visible"),
        Fact("gpu_attention_backend", "GPU attention backend", gpu_attention_backend(), gpu_attention_backend()),
        *_cpu_facts(),
    ]


def format_facts(facts: List[Fact]) -> str:
    """The facts as aligned ``label: text`` lines."""
    width = max(len(fact.label) for fact in facts) + 1
    return "\n".join(f"{fact.label + ':':<{width}} {fact.text}" for fact in facts)
