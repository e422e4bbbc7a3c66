"""The CPU kernels' instruction-set copies as the tests force them: ATTN_OPS_CPU_ISA (read at every call)
caps the copy the library picks; a level above the CPU's is never taken, so such a case is skipped."""
import pytest
import torch

ISA_LEVELS = ["default", "avx2", "avx512"]


def isa_levels_of_this_cpu():
    """The copies this CPU runs, lowest first (from PyTorch's CPU capability; "default" alone elsewhere)."""
    best = torch.backends.cpu.get_cpu_capability().lower()
    return ISA_LEVELS[:ISA_LEVELS.index(best) + 1] if best in ISA_LEVELS else ["default"]


def force_isa(monkeypatch, isa):
    """Skips the test where the CPU lacks `isa`; else the library picks that copy for the test's duration."""
    if isa not in isa_levels_of_this_cpu():
        pytest.skip(f"this CPU lacks {isa}")
    monkeypatch.setenv("ATTN_OPS_CPU_ISA", isa)
    return isa
