"""Shared helpers for the attn_ops benchmarks: timing, machine description, measured ceilings,
memory estimates and markdown tables. Plain PyTorch only (no attn_ops import here)."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from typing import Callable

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GiB = 1024**3


def import_attn_ops():
    """Import attn_ops: an installed copy first, else the source tree next to this file (an
    in-place build). Appending (not prepending) the repo root keeps an installed copy in charge."""
    if REPO_ROOT not in sys.path:
        sys.path.append(REPO_ROOT)
    import attn_ops

    return attn_ops


# ----------------------------------------------------------------------------------- timing


def sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def measure(fn: Callable[[], object], *, device: str, repeats: int = 5, warmup: int = 1,
            budget_s: float = 5.0, first_counts_above_s: float = 1.0) -> dict:
    """Time fn() with time.perf_counter (synchronizing CUDA around each call).

    - `warmup` untimed calls first. On CPU, if the first warm-up call alone takes longer than
      `first_counts_above_s`, it is kept as a sample instead: at that scale the cold-start cost is
      negligible, and it saves one multi-second run for the huge cases. (Never on CUDA, where the
      first call may include compilation or autotuning.)
    - Then up to `repeats` timed calls, stopping early once another call would push the time spent
      timing past `budget_s` (at least one sample always).
    Returns {"median_s", "min_s", "n", "samples", "result"} where result is the last return value.
    """
    cpu = not str(device).startswith("cuda")
    samples: list[float] = []
    result = None
    for i in range(warmup):
        sync(device)
        t0 = time.perf_counter()
        result = fn()
        sync(device)
        dt = time.perf_counter() - t0
        if cpu and i == 0 and dt > first_counts_above_s:
            samples.append(dt)
            break
    start = time.perf_counter()
    while len(samples) < repeats:
        if samples:
            spent = time.perf_counter() - start
            if spent + statistics.median(samples) > budget_s:
                break
        sync(device)
        t0 = time.perf_counter()
        result = fn()
        sync(device)
        samples.append(time.perf_counter() - t0)
    return {
        "median_s": statistics.median(samples),
        "min_s": min(samples),
        "n": len(samples),
        "samples": samples,
        "result": result,
    }


# ----------------------------------------------------------------------------- machine info


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def available_memory_bytes(device: str) -> int:
    """Memory that a new allocation can still get: MemAvailable on CPU, free memory on CUDA."""
    if str(device).startswith("cuda"):
        free, _total = torch.cuda.mem_get_info()
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * GiB  # unknown platform: assume a modest machine


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", REPO_ROOT, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            dirty = subprocess.run(["git", "-C", REPO_ROOT, "status", "--porcelain"],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            return out.stdout.strip() + (" (+ uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "no commit"


def machine_info(device: str) -> dict:
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count()
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    info = {
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": affinity,
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "memory_total_gib": None,
        "loadavg_at_start": load,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python " + shlex.join(sys.argv),
        "git_commit": git_commit(),
    }
    try:
        with open("/proc/meminfo") as f:
            info["memory_total_gib"] = round(int(f.readline().split()[1]) / 1024**2, 1)
    except (OSError, ValueError, IndexError):
        pass
    if str(device).startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info["gpu"] = props.name
        info["gpu_memory_gib"] = round(props.total_memory / GiB, 1)
        info["cuda"] = torch.version.cuda
        info["cudnn"] = torch.backends.cudnn.version()
    return info


# -------------------------------------------------------------------------------- ceilings


def matmul_ceiling(device: str, dtype: torch.dtype, n_max: int = 4096,
                   target_s: float = 3.0) -> dict:
    """GFLOP/s of an n x n x n matmul (2 n^3 flops). n doubles from 256 up to n_max while one
    call is predicted to stay under target_s (some CPUs run bfloat16 matmul very slowly)."""
    n = 256
    while True:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        m = measure(lambda: a @ b, device=device, repeats=3, warmup=1, budget_s=3 * target_s)
        if n >= n_max or m["median_s"] * 8 > target_s:
            return {"n": n, "dtype": str(dtype).replace("torch.", ""),
                    "gflops": 2 * n**3 / m["median_s"] / 1e9}
        n *= 2


def copy_ceiling(device: str, nbytes: int = 512 * 1024**2) -> dict:
    """GB/s of dst.copy_(src) on nbytes buffers, counting bytes read + bytes written."""
    src = torch.ones(nbytes // 4, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch of dst's pages
    m = measure(lambda: dst.copy_(src), device=device, repeats=5, warmup=1, budget_s=5.0)
    return {"bytes": nbytes, "gbps": 2 * nbytes / m["median_s"] / 1e9}


# --------------------------------------------------------------------------------- markdown


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    cells = [header] + rows
    widths = [max(len(str(r[i])) for r in cells) for i in range(len(header))]

    def line(r):
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep] + [line(r) for r in rows[:]])


def fmt_bytes(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB / 10 else f"{n / 1024**2:.0f} MiB"
