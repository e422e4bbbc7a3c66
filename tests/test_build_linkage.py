"""The operator library links the shared C++ runtime that torch uses (attn_ops/_linkage.py says why a static
copy crashes), and the check that setup.py runs after the build tells the two apart."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

import attn_ops
from attn_ops import _linkage

TORCH_C10 = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so")
LINUX = sys.platform.startswith("linux")

# A library that passes a stream of its own to a C++ runtime function, like attn_ops' shape formatting.
SOURCE = """
#include <sstream>
#include <string>
std::string format_number(long value) {
  std::ostringstream out;
  out << value;
  return out.str();
}
"""


@pytest.mark.skipif(not LINUX, reason="ELF libraries: Linux only")
def test_operator_library_links_shared_libstdcxx():
    library = attn_ops._C.__file__
    needed = _linkage.needed_libraries(library)
    assert needed is not None and _linkage.links_shared_libstdcxx(needed), needed
    assert _linkage.static_libstdcxx_problem(library, TORCH_C10) is None


def test_needed_libraries_of_non_elf_file_is_none(tmp_path):
    path = tmp_path / "not_elf.so"
    path.write_bytes(b"#!/bin/sh\n" + bytes(range(256)))
    assert _linkage.needed_libraries(str(path)) is None
    assert _linkage.static_libstdcxx_problem(str(path), TORCH_C10) is None
    # a platform without libc10.so where setup.py looks for it (macOS: .dylib): no verdict, no error
    assert _linkage.static_libstdcxx_problem(attn_ops._C.__file__, str(tmp_path / "libc10.so")) is None


@pytest.mark.skipif(not LINUX or shutil.which("g++") is None, reason="needs g++ on Linux to build two libraries")
@pytest.mark.parametrize("static", [False, True], ids=["shared_runtime", "static_runtime"])
def test_check_names_a_static_runtime(tmp_path, static):
    source = tmp_path / "format.cpp"
    source.write_text(SOURCE)
    library = tmp_path / "libformat.so"
    flags = ["-static-libstdc++"] if static else []
    built = subprocess.run(["g++", "-shared", "-fPIC", "-O1", *flags, str(source), "-o", str(library)],
                           capture_output=True, text=True)
    if static and built.returncode != 0:
        pytest.skip(f"g++ cannot link libstdc++ statically here: {built.stderr.strip()[-200:]}")
    assert built.returncode == 0, built.stderr
    needed = _linkage.needed_libraries(str(library))
    assert _linkage.links_shared_libstdcxx(needed) != static, needed
    problem = _linkage.static_libstdcxx_problem(str(library), TORCH_C10)
    if static:
        assert problem is not None and "does not link the shared libstdc++ that torch uses" in problem
        assert "libformat.so" in problem and "CXX=/usr/bin/g++" in problem
    else:
        assert problem is None
