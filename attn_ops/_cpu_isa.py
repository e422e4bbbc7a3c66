"""Which instruction-set copy of the CPU kernels this machine runs, and whether they use AVX512-BF16 and AMX:
the rule of csrc/common/cpu_isa.cpp, restated in Python for ``python -m attn_ops`` (keep the two in step).

* The copies: x86-64 builds with a GCC-compatible compiler (setup.py on Linux and macOS; not MSVC) carry a
  portable ("default"), an AVX2 and an AVX-512 copy of the vector kernels; other builds only the portable one.
* The copy: the best that PyTorch reports (``torch.backends.cpu.get_cpu_capability()``, which
  ``ATEN_CPU_CAPABILITY`` lowers), lowered further by ``ATTN_OPS_CPU_ISA=default|avx2|avx512`` when set and
  not empty (a level above the CPU's is never taken; any other value makes every CPU kernel call raise).
* AVX512-BF16 (bfloat16 rounding and products): when the CPU has it, the copy is avx512, and
  ``ATTN_OPS_CPU_AVX512BF16`` is not ``0``.
* AMX-BF16 (the bfloat16 decode's tile products): when the CPU has it, the copy is avx512,
  ``ATTN_OPS_CPU_AMX`` is not ``0``, and Linux grants the process the tile state, which the library requests
  (``arch_prctl(ARCH_REQ_XCOMP_PERM)``) at its first use; this module does not make that request.

The C++ asks the CPU itself (cpuid); here the flags of /proc/cpuinfo stand in for it (Linux only).
"""
import os
import platform
import sys
from typing import NamedTuple, Optional, Set

import torch

ISA_LEVELS = ("default", "avx2", "avx512")
_FROM_TORCH_CAPABILITY = {"AVX512": "avx512", "AVX2": "avx2"}


class IsaChoice(NamedTuple):
    """The copy the CPU kernels run (one of ISA_LEVELS) and why, in words."""

    isa: str
    reason: str


def carries_isa_copies() -> bool:
    """Whether this build carries the AVX2 and AVX-512 copies (x86-64, compiled by GCC or Clang)."""
    return platform.machine().lower() in ("x86_64", "amd64") and sys.platform != "win32"


def choose_isa(environ=os.environ) -> IsaChoice:
    """The copy cpu_isa() picks. ValueError for an ATTN_OPS_CPU_ISA the library refuses."""
    capability = torch.backends.cpu.get_cpu_capability()
    if not carries_isa_copies():
        return IsaChoice("default", f"this build carries only the portable copy ({platform.machine()})")
    best = _FROM_TORCH_CAPABILITY.get(capability, "default")
    forced = environ.get("ATTN_OPS_CPU_ISA", "")
    if not forced:
        return IsaChoice(best, f"torch reports {capability}; ATTN_OPS_CPU_ISA is not set")
    if forced not in ISA_LEVELS:
        raise ValueError(f"ATTN_OPS_CPU_ISA={forced!r} is not one of {', '.join(ISA_LEVELS)}: every call of a CPU "
                         "kernel raises until it is corrected or unset")
    if ISA_LEVELS.index(forced) > ISA_LEVELS.index(best):
        return IsaChoice(best, f"torch reports {capability}; ATTN_OPS_CPU_ISA={forced} is above it, so not taken")
    return IsaChoice(forced, f"torch reports {capability}; capped by ATTN_OPS_CPU_ISA={forced}")


def cpu_flags() -> Optional[Set[str]]:
    """The CPU feature flags of /proc/cpuinfo, or None where there is none (not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def cpu_model_name() -> str:
    """The CPU's model name from /proc/cpuinfo, else what the platform module knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _extension_use(flag: str, switch: str, isa: str, flags: Optional[Set[str]], environ) -> str:
    """Whether the avx512 copy uses the extension of CPU flag ``flag`` (which ``switch=0`` turns off), in words."""
    if flags is None:
        return "unknown (no /proc/cpuinfo to read the CPU flags from)"
    if flag not in flags:
        return "not present in CPU flags"
    if not carries_isa_copies():
        return "present in CPU flags; not used: this build has no avx512 copy"
    if isa != "avx512":
        return f"present in CPU flags; not used: the {isa} copy runs"
    if environ.get(switch) == "0":
        return f"present in CPU flags; not used: {switch}=0"
    return "present in CPU flags; used by the avx512 copy"


def avx512_bf16_use(isa: str, flags: Optional[Set[str]], environ=os.environ) -> str:
    """Whether the kernels use AVX512-BF16 here, in words."""
    return _extension_use("avx512_bf16", "ATTN_OPS_CPU_AVX512BF16", isa, flags, environ)


def amx_bf16_use(isa: str, flags: Optional[Set[str]], environ=os.environ) -> str:
    """Whether the kernels use AMX-BF16 here, in words (the OS's grant of the tile state is not asked here)."""
    use = _extension_use("amx_bf16", "ATTN_OPS_CPU_AMX", isa, flags, environ)
    if use.endswith("used by the avx512 copy"):
        return use + " if Linux grants the tile state, which the library requests at its first use"
    return use
