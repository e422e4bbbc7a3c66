"""``python -m attn_ops``: the report of what this machine gets and the self-test (attn_ops/__main__.py,
_report.py, _selftest.py, _cpu_isa.py, _fatbin.py)."""
import json
import os
import struct
import subprocess
import sys

import pytest
import torch

import attn_ops
from attn_ops import _C, _cpu_isa, _selftest
from attn_ops.__main__ import main
from attn_ops._fatbin import cuda_architectures
from attn_ops._gpu_backend import cuda_kernels_compiled

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_module(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("ATTN_OPS_CPU_ISA", None)
    return subprocess.run([sys.executable, "-m", "attn_ops", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_report_and_self_test_pass():
    done = run_module()
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert f"attn_ops:              {attn_ops.__version__}" in out
    assert f"torch:                 {torch.__version__}" in out
    assert f"CPU kernel copy:       {_cpu_isa.choose_isa({}).isa} (" in out
    assert "ok   attention [cpu]" in out and "ok   attention_backward [cpu]" in out
    assert f"{len(_selftest.CHECKS)} of {len(_selftest.CHECKS)} checks passed" in out
    assert "FAIL" not in out


def test_no_test_prints_the_report_only():
    done = run_module("--no-test")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CPU kernel copy:" in done.stdout
    assert "self-test" not in done.stdout and "ok   " not in done.stdout


def test_every_public_op_has_a_check():
    """Each operator of attn_ops.__all__ (not the table helpers rotary_cos_sin / alibi_slopes, nor the module
    transformation tensor_parallel) is named by a self-test check."""
    helpers = {"rotary_cos_sin", "alibi_slopes", "tensor_parallel"}
    ops = {name for name in attn_ops.__all__ if callable(getattr(attn_ops, name)) and name not in helpers}
    checked = {check.name.split()[0] for check in _selftest.CHECKS}
    assert ops - checked == set()


def wrong_check(x):
    """A deliberately wrong op: the reference times 1.5."""
    reference = x.randn(3, 4).double()
    return [(reference * 1.5, reference)]


def raising_check(x):
    raise RuntimeError("attn_ops.attention: q must be 4-D\n(details)")


def test_a_failing_check_fails_the_command(capsys):
    checks = [_selftest.CHECKS[0], _selftest.Check("wrong_op", 1e-4, wrong_check),
              _selftest.Check("raising_op", 1e-4, raising_check)]
    assert main([], checks=checks) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "ok   attention [cpu]: " in "\n".join(lines)
    assert any(line.startswith("FAIL wrong_op [cpu]: ") and line.endswith(" > 1e-04") for line in lines), lines
    assert "FAIL raising_op [cpu]: raised RuntimeError: attn_ops.attention: q must be 4-D" in lines
    assert "1 of 3 checks passed" in "\n".join(lines)


def test_json(capsys):
    assert main(["--json"], checks=[_selftest.Check("wrong_op", 1e-4, wrong_check)]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["report"]["attn_ops"] == attn_ops.__version__
    assert document["report"]["cuda_kernels"] == cuda_kernels_compiled()
    check, = document["self_test"]["checks"]
    assert (check["name"], check["device"], check["passed"]) == ("wrong_op", "cpu", False)
    assert 0 < check["error"] < 0.5 and check["problem"] is None  # 0.5 |r| / (1 + |r|) at the largest |r|
    assert document["self_test"]["passed"] is False
    assert main(["--json", "--no-test"]) == 0
    assert json.loads(capsys.readouterr().out)["self_test"] is None


@pytest.mark.skipif(not _cpu_isa.carries_isa_copies(), reason="this build carries the portable copy only")
def test_isa_rule_follows_cpu_isa_cpp():
    best = {"AVX512": "avx512", "AVX2": "avx2"}.get(torch.backends.cpu.get_cpu_capability(), "default")
    assert _cpu_isa.choose_isa({}).isa == best
    assert _cpu_isa.choose_isa({"ATTN_OPS_CPU_ISA": ""}).isa == best
    for forced in _cpu_isa.ISA_LEVELS:  # capped, never raised above the CPU's best
        expected = min(forced, best, key=_cpu_isa.ISA_LEVELS.index)
        assert _cpu_isa.choose_isa({"ATTN_OPS_CPU_ISA": forced}).isa == expected
    with pytest.raises(ValueError, match="ATTN_OPS_CPU_ISA='AVX2' is not one of default, avx2, avx512"):
        _cpu_isa.choose_isa({"ATTN_OPS_CPU_ISA": "AVX2"})  # the library's names are lower case


def test_avx512_extensions_need_the_avx512_copy():
    flags = {"avx512_bf16", "amx_bf16"}
    if _cpu_isa.carries_isa_copies():
        assert _cpu_isa.avx512_bf16_use("avx512", flags, {}).endswith("used by the avx512 copy")
        assert _cpu_isa.avx512_bf16_use("avx2", flags, {}).endswith("not used: the avx2 copy runs")
        assert _cpu_isa.avx512_bf16_use("avx512", flags, {"ATTN_OPS_CPU_AVX512BF16": "0"}).endswith("=0")
        assert "requests at its first use" in _cpu_isa.amx_bf16_use("avx512", flags, {})
        assert _cpu_isa.amx_bf16_use("avx512", flags, {"ATTN_OPS_CPU_AMX": "0"}).endswith("ATTN_OPS_CPU_AMX=0")
    assert _cpu_isa.amx_bf16_use("avx512", set(), {}) == "not present in CPU flags"
    assert _cpu_isa.avx512_bf16_use("avx512", None, {}).startswith("unknown")


def elf_with_section(name, payload):
    """A minimal ELF64 little-endian file: a null section, the section-name table and ``name``."""
    names = b"\0.shstrtab\0" + name + b"\0"
    data_offset = 64
    names_offset = data_offset + len(payload)
    shoff = names_offset + len(names)
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HHH", header, 0x3A, 64, 3, 1)
    sections = [struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
                struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, names_offset, len(names), 0, 0, 1, 0),
                struct.pack("<IIQQQQIIQQ", 11, 1, 0, 0, data_offset, len(payload), 0, 0, 8, 0)]
    return bytes(header) + payload + names + b"".join(sections)


def fatbin_container(entries):
    """A fat binary container of (kind, architecture, payload size) entries (payloads of zeros)."""
    body = b"".join(struct.pack("<HHIQ", kind, 0x101, 64, size) + bytes(12) + struct.pack("<I", arch)
                    + bytes(32) + bytes(size) for kind, arch, size in entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def test_fatbin_architectures(tmp_path):
    library = tmp_path / "lib.so"
    # two containers (one translation unit each) with padding between them; SASS is kind 2, PTX kind 1
    fatbin = fatbin_container([(2, 90, 24), (2, 80, 8)]) + bytes(8) + fatbin_container([(1, 90, 16), (2, 90, 8)])
    library.write_bytes(elf_with_section(b".nv_fatbin", fatbin))
    assert cuda_architectures(str(library)) == ["sm_80", "sm_90", "compute_90"]
    library.write_bytes(elf_with_section(b".text", b"\0" * 8))
    assert cuda_architectures(str(library)) == []
    library.write_bytes(b"MZ not an ELF file")
    assert cuda_architectures(str(library)) is None


def test_this_library_carries_device_code_only_when_it_has_cuda_kernels():
    archs = cuda_architectures(_C.__file__)
    assert archs is None or bool(archs) == cuda_kernels_compiled()
    assert all(arch.startswith(("sm_", "compute_")) for arch in archs or [])
