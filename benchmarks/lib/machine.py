"""What the benchmarks record about the machine: CPU / GPU, memory, versions, git commit, the exact
command, and the two ceilings measured in each run (a large matmul per dtype, a large copy); also how
a benchmark imports attn_ops and frees memory between cases."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys

import torch

from baselines import DTYPES
from reporting import GiB, fmt_bytes
from timing import measure


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def import_attn_ops():
    """Import attn_ops: an installed copy first, else the source tree next to this file (an
    in-place build). Appending (not prepending) the repo root keeps an installed copy in charge."""
    if REPO_ROOT not in sys.path:
        sys.path.append(REPO_ROOT)
    import attn_ops

    return attn_ops


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


def fits(nbytes: float, device: str, fraction: float = 0.8) -> bool:
    return nbytes <= fraction * available_memory_bytes(device)


def free_memory(device: str) -> None:
    import gc

    gc.collect()
    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()


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
        info["gpu_sms"] = props.multi_processor_count
        info["gpu_l2_mib"] = round(int(getattr(props, "L2_cache_size", 0)) / 1024**2, 1)
        info["gpu_capability"] = f"{props.major}.{props.minor}"
    return info


def matmul_ceiling(device: str, dtype: torch.dtype, n_max: int = 4096,
                   target_s: float = 3.0) -> dict:
    """GFLOP/s of an n x n x n matmul (2 n^3 flops) on random inputs. n doubles from 256 up to n_max
    while one call is predicted to stay under target_s (some CPUs run bfloat16 matmul very slowly)."""
    n = 256
    while True:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        m = measure(lambda: a @ b, device=device, repeats=3 if device == "cpu" else 10, warmup=1,
                    budget_s=3 * target_s)
        if n >= n_max or m["median_s"] * 8 > target_s:
            return {"n": n, "dtype": str(dtype).replace("torch.", ""),
                    "gflops": 2 * n**3 / m["median_s"] / 1e9}
        n *= 2


def copy_ceiling(device: str, nbytes: int | None = None) -> dict:
    """GB/s of dst.copy_(src) on nbytes buffers, counting bytes read + bytes written (0.5 GiB on
    CPU; 2 GiB of random values on a GPU, far larger than its L2)."""
    cuda = str(device).startswith("cuda")
    nbytes = nbytes or (2 * GiB if cuda else 512 * 1024**2)
    if cuda:
        src = torch.rand(nbytes // 4, device=device, dtype=torch.float32)
    else:
        src = torch.ones(nbytes // 4, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch of dst's pages
    m = measure(lambda: dst.copy_(src), device=device, repeats=5 if not cuda else 10, warmup=1,
                budget_s=5.0)
    return {"bytes": nbytes, "gbps": 2 * nbytes / m["median_s"] / 1e9}


def read_ceiling(device: str, nbytes: int | None = None) -> dict:
    """GB/s of x.sum() over nbytes of float32 (1 GiB on CPU, 2 GiB on a GPU): a read-only stream, the
    limit of a kernel that only reads its inputs (decode). The copy ceiling counts a write per byte read,
    which costs more than a read (the written lines are read first unless the stores bypass the cache)."""
    nbytes = nbytes or (2 * GiB if str(device).startswith("cuda") else GiB)
    x = torch.ones(nbytes // 4, device=device, dtype=torch.float32)
    m = measure(lambda: x.sum(), device=device, repeats=5, warmup=1, budget_s=5.0)
    return {"bytes": nbytes, "gbps": nbytes / m["median_s"] / 1e9}


def measure_ceilings(device: str, matmul_dtypes: list[str]) -> dict:
    """The machine's two ceilings, measured in this run and printed: a large matmul per dtype
    (float32 first) and a large copy. {"matmul": [matmul_ceiling...], "copy": copy_ceiling}."""
    ceilings = {"matmul": [], "copy": None}
    for dt in ["float32"] + [x for x in matmul_dtypes if x != "float32"]:
        c = matmul_ceiling(device, DTYPES[dt], n_max=8192 if device == "cuda" else 4096)
        ceilings["matmul"].append(c)
        print(f"# ceiling: {dt} matmul {c['n']}^3: {c['gflops']:.1f} GFLOP/s", flush=True)
    ceilings["copy"] = copy_ceiling(device)
    print(f"# ceiling: copy {fmt_bytes(ceilings['copy']['bytes'])}: "
          f"{ceilings['copy']['gbps']:.1f} GB/s (read + write)", flush=True)
    return ceilings


def matmul_gflops(ceilings: dict, dtype: str) -> float | None:
    for c in ceilings["matmul"]:
        if c["dtype"] == dtype:
            return c["gflops"]
    return None
