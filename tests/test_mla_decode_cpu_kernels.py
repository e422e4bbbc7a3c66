"""The CPU kernels behind mla_decode, each forced in turn, against the float64 reference.

mla_decode on the CPU is MQA over the latent cache (csrc/attention/cpu/decode_*): with 8 to 128 query
rows per sequence (Tq x H) it runs decode_rows_gemm, whose kernel depends on the instruction set and the
dtype (csrc/attention/cpu/decode_gemm_kernel.h):
  - AVX-512, float32 / float16 (and bfloat16 where the CPU has neither AMX nor AVX512-BF16):
    register-blocked FMA micro-kernels, float32 tiles in place, float16 / bfloat16 tiles converted to
    float32 once;
  - AVX-512 with AMX-BF16, bfloat16: tile products in bfloat16 with float32 accumulation
    (decode_amx_kernel.h; ATTN_OPS_CPU_AMX=0 turns it off);
  - AVX-512 with AVX512-BF16 and no AMX (or AMX turned off: "avx512_noamx"), bfloat16: the products on
    bfloat16 pairs (vdpbf16ps, decode_rows_pairs); ATTN_OPS_CPU_AVX512BF16=0 turns it off as well, so
    "avx512_fma" runs bfloat16 on the FMA kernels on every AVX-512 CPU;
  - AVX2, portable, float64: two BLAS GEMMs per key tile.
Fewer rows (H = 1, 3) take the streaming kernel; they are here too, so every head count meets the
reference under every copy. ATTN_OPS_CPU_ISA (read at every call) selects the copy. Lengths straddle the
128-key tile and the paged blocks (partial tiles and paged tiles are gathered, zero-padded, on AMX), with
a row of length 1 and an empty row."""

import pytest
import torch

from cpu_isa_helpers import ISA_LEVELS, force_isa
from test_mla_ops import ALL_DTYPES, dtype_id, run_case

LENS = [1, 63, 64, 65, 129, 1000, 0]


@pytest.fixture(params=ISA_LEVELS + ["avx512_noamx", "avx512_fma"])
def isa(request, monkeypatch):
    monkeypatch.setenv("ATTN_OPS_CPU_AMX", "1" if request.param in ISA_LEVELS else "0")
    monkeypatch.setenv("ATTN_OPS_CPU_AVX512BF16", "0" if request.param == "avx512_fma" else "1")
    return force_isa(monkeypatch, request.param.split("_")[0])


@pytest.mark.parametrize("layout", ["contig", "paged16"])
@pytest.mark.parametrize("H", [1, 3, 16, 17, 128])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_heads_lengths_layouts(isa, dtype, H, layout):
    torch.manual_seed(H)
    run_case(LENS, 1, H, "dc512_dr64", layout, dtype, "cpu")


@pytest.mark.parametrize("layout", ["contig", "paged64"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_two_positions_32_rows(isa, dtype, layout):
    """Tq 2 x H 16: 32 rows per sequence under the causal mask; then head dims off the vector width
    (d_c 40, d_rope 8: no AMX path, the FMA kernel's scalar column tail) with 18 rows."""
    torch.manual_seed(2)
    run_case([1, 65, 129, 0, 300], 2, 16, "dc512_dr64", layout, dtype, "cpu")
    run_case([1, 65, 200], 2, 9, (40, 8), layout, dtype, "cpu")
