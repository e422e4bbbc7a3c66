"""tools/native_backtrace.py, the GPU check's crash reporter: it names the native frame of a segfault and
returns the shell's exit status for it."""
import os
import shutil
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools", "native_backtrace.py")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("gcc") is None,
                                reason="builds an LD_PRELOAD handler with gcc (Linux)")


def run(code):
    return subprocess.run([sys.executable, SCRIPT, "--", sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=120)


def test_segfault_is_reported_with_its_frames():
    # ctypes.string_at(0) reads address 0 inside libc's strlen
    done = run("import ctypes; ctypes.string_at(0)")
    assert done.returncode == 128 + 11, done.stderr
    assert "=== native backtrace: signal 11 at address (nil)" in done.stderr
    pc = [line for line in done.stderr.splitlines() if line.startswith("=== pc ")]
    assert len(pc) == 1 and "libc" in pc[0], done.stderr
    assert any(line.startswith("=== frame ") for line in done.stderr.splitlines())


def test_clean_exit_passes_through():
    done = run("import sys; print('fine'); sys.exit(3)")
    assert done.returncode == 3 and done.stdout.strip() == "fine"
    assert "native backtrace" not in done.stderr
