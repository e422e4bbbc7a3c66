"""Peak CPU memory of one call, measured in a fresh child process (Linux).

The child builds the inputs, warms the runtime up on a tiny case, resets the kernel's resident-set
high-water mark (`echo 5 > /proc/self/clear_refs`), runs the call once and reports VmHWM minus the
resident size before the call: the extra memory the call needed at its peak (inputs excluded). A fresh
process per measurement keeps freed memory cached by the allocator from hiding a peak.
"""
from __future__ import annotations

import json
import subprocess
import sys


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_extra_bytes(fn) -> int:
    """Run fn() once in this process; the resident-set growth at its peak, in bytes."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_kib("VmRSS")
    fn()
    return (_status_kib("VmHWM") - before) * 1024


def measure_in_child(script: str, args: list[str], timeout_s: float = 900) -> dict:
    """Run `python script --child args...`, which prints one JSON line last; return it (or {"error": ...})."""
    proc = subprocess.run([sys.executable, script, "--child", *args], capture_output=True, text=True,
                          timeout=timeout_s)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        return {"error": tail[-1] if tail else f"exit code {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])
