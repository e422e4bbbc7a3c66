"""Shared helpers for the attn_ops benchmarks (bench_attention.py, bench_decode.py, bench_mla.py):
timing (host clock on CPU, CUDA events on GPU), machine description, measured ceilings (matmul rate,
copy bandwidth), time budgets, the plain-PyTorch baselines that several scripts compare against
(HuggingFace's repeat_kv + eager attention, compiled FlexAttention, SDPA backends), command-line
options every script takes, and the markdown / json output. Plain PyTorch only (no attn_ops import
here)."""

from __future__ import annotations

import datetime
import json
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
            budget_s: float = 5.0, first_counts_above_s: float = 1.0,
            flush_l2: bool = False) -> dict:
    """Time fn(): host clock on CPU, CUDA events on a GPU (measure_cuda, which takes flush_l2).

    CPU (time.perf_counter around each call):
    - `warmup` untimed calls first. If the first warm-up call alone takes longer than
      `first_counts_above_s`, it is kept as a sample instead: at that scale the cold-start cost is
      negligible, and it saves one multi-second run for the huge cases.
    - Then up to `repeats` timed calls, stopping early once another call would push the time spent
      timing past `budget_s` (at least one sample always).
    Returns {"median_s", "min_s", "n", "samples", "result"} where result is the last return value.
    """
    if str(device).startswith("cuda"):
        return measure_cuda(fn, repeats=repeats, warmup=warmup, budget_s=budget_s, flush_l2=flush_l2)
    samples: list[float] = []
    result = None
    for i in range(warmup):
        t0 = time.perf_counter()
        result = fn()
        dt = time.perf_counter() - t0
        if i == 0 and dt > first_counts_above_s:
            samples.append(dt)
            break
    start = time.perf_counter()
    while len(samples) < repeats:
        if samples:
            spent = time.perf_counter() - start
            if spent + statistics.median(samples) > budget_s:
                break
        t0 = time.perf_counter()
        result = fn()
        samples.append(time.perf_counter() - t0)
    return _timing(samples, result)


def _timing(samples: list[float], result) -> dict:
    return {"median_s": statistics.median(samples), "min_s": min(samples), "n": len(samples),
            "samples": samples, "result": result}


_L2_FLUSH = {}


def l2_flush_buffer() -> torch.Tensor:
    """A device buffer of twice the L2 size (at least 64 MiB); writing it evicts the L2."""
    if "buf" not in _L2_FLUSH:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        l2 = int(getattr(props, "L2_cache_size", 0) or 50 * 1024**2)
        _L2_FLUSH["buf"] = torch.empty(max(2 * l2, 64 * 1024**2), dtype=torch.int8, device="cuda")
    return _L2_FLUSH["buf"]


def measure_cuda(fn: Callable[[], object], *, repeats: int = 20, warmup: int = 3,
                 budget_s: float = 5.0, flush_l2: bool = False) -> dict:
    """GPU time of fn() from CUDA events recorded around each call on the current stream.

    `warmup` untimed calls (compilation, autotuning, handle creation stay out), one timed call to
    size the run, then up to `repeats` samples in all, as many as fit in `budget_s` (>= 1).
    flush_l2: before each call, write a buffer of twice the L2 size (outside the events), so that
    memory-bound calls read their inputs from device memory, not from a warm L2 (as
    triton.testing.do_bench). The events enclose the device work of one call; the host work of
    the call overlaps the flush (or the previous call), so this is device time: for calls whose
    host overhead exceeds their device time, the user-visible time is longer (capture a CUDA
    graph to remove it).
    """
    flush = l2_flush_buffer() if flush_l2 else None
    result = None
    for _ in range(warmup):
        result = fn()
    torch.cuda.synchronize()

    def timed(n):
        evs = []
        for _ in range(n):
            if flush is not None:
                flush.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            out = fn()
            e.record()
            evs.append((s, e))
        torch.cuda.synchronize()
        return [s.elapsed_time(e) / 1e3 for s, e in evs], out

    t0 = time.perf_counter()
    samples, result = timed(1)
    wall_one = max(time.perf_counter() - t0, samples[0])
    more = min(repeats - 1, int(max(budget_s - wall_one, 0.0) / max(wall_one, 1e-6)))
    if more > 0:
        extra, result = timed(more)
        samples += extra
    return _timing(samples, result)


class Budget:
    """A wall-clock deadline for a whole run (--time-budget): cases that start after it are skipped
    (and listed), so a run under an outer time limit still writes its report."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def expired(self) -> bool:
        return self.seconds is not None and self.elapsed() > self.seconds


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
        info["gpu_sms"] = props.multi_processor_count
        info["gpu_l2_mib"] = round(int(getattr(props, "L2_cache_size", 0)) / 1024**2, 1)
        info["gpu_capability"] = f"{props.major}.{props.minor}"
    return info


# -------------------------------------------------------------------------------- ceilings


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


# ------------------------------------------------------------------------- shared baselines

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """HuggingFace's repeat_kv: [B, Hkv, T, D] -> [B, Hkv * n_rep, T, D] (a copy)."""
    b, hkv, t, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, hkv, n_rep, t, d).reshape(b, hkv * n_rep, t, d)


def eager_attention(q, k, v, mask, scale):
    """HuggingFace's eager_attention_forward (dropout 0), on [B, H, T, D] tensors: repeat_kv,
    q @ k^T * scale, + additive mask, softmax in float32, cast back, @ v."""
    n_rep = q.shape[1] // k.shape[1]
    k = repeat_kv(k, n_rep)
    v = repeat_kv(v, n_rep)
    w = torch.matmul(q, k.transpose(2, 3)) * scale
    if mask is not None:
        w = w + mask
    w = torch.nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(w, v)


_FLEX = {}


def flex_compiled():
    """torch.compile(flex_attention) (one handle per process; every new shape recompiles)."""
    if "fn" not in _FLEX:
        from torch.nn.attention.flex_attention import flex_attention

        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 1024)
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX["fn"]


SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}


def sdpa_backend(name: str):
    """The context manager that restricts SDPA to one backend ("flash", "cudnn", "efficient",
    "math"), torch.nn.attention.sdpa_kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[name]))


def is_oom(e: BaseException) -> bool:
    msg = str(e).lower()
    return (isinstance(e, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in msg
            or "can't allocate memory" in msg)


def first_line(e: BaseException, limit: int = 200) -> str:
    msg = str(e).strip()
    return msg.splitlines()[0][:limit] if msg else type(e).__name__


def rel_maxdiff(a: torch.Tensor, ref: torch.Tensor) -> float:
    """max |a - ref| / max |ref| (0 for empty tensors)."""
    if a.numel() == 0:
        return 0.0
    a, ref = a.float(), ref.float()
    return float((a - ref).abs().max()) / max(float(ref.abs().max()), 1e-30)


def randn(shape, dtype, device, generator: torch.Generator) -> torch.Tensor:
    """Random normal values drawn on `device` with a generator of that device (large caches are
    drawn on the GPU, not copied from the host)."""
    return torch.randn(*shape, generator=generator, device=device, dtype=dtype)


def generator(device: str, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def free_memory(device: str) -> None:
    import gc

    gc.collect()
    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()


def cuda_graph(fn: Callable[[], object], warmup: int = 2):
    """Captures fn() (warmed up on a side stream first) in a CUDA graph. Returns (graph, outputs
    of the captured call): graph.replay() re-runs it on the same input and output buffers."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


# ------------------------------------------------------------------------ command line, output


def add_common_args(p, *, repeats_help: str = "samples per median (default: CPU 5, CUDA 20)"):
    """Options every benchmark takes: device, quick mode, timing, time budget, outputs."""
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--repeats", type=int, default=None, help=repeats_help)
    p.add_argument("--warmup", type=int, default=None, help="untimed calls (default: CPU 1, CUDA 3)")
    p.add_argument("--budget", type=float, default=5.0,
                   help="stop repeating a measurement after this many seconds (>= 1 sample)")
    p.add_argument("--time-budget", type=float, default=None,
                   help="whole-run budget in seconds: cases that would start later are skipped "
                        "and listed (the report is still written)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the markdown report here (rewritten after every case)")
    p.add_argument("--json", help="write the raw results here (rewritten after every case)")


def finish_common_args(p, args, *, quick_repeats: int = 3) -> None:
    """Defaults that depend on the device; fails when --device cuda has no GPU."""
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but torch.cuda.is_available() is False")
    cuda = args.device == "cuda"
    if args.repeats is None:
        args.repeats = (10 if cuda else quick_repeats) if getattr(args, "quick", False) \
            else (20 if cuda else 5)
    if args.warmup is None:
        args.warmup = 3 if cuda else 1


def header_lines(info: dict, ceilings: dict, elapsed_s: float, device: str) -> list[str]:
    """Markdown bullet lines: machine, GPU, versions, git commit, date, exact command, and the
    ceilings measured in this run."""
    L = []
    mach = (f"{info['cpu']}, {info['usable_cores']} usable cores ({info['logical_cores']} logical), "
            f"torch.get_num_threads() = {info['torch_threads']}, CPU capability "
            f"{info['cpu_capability']}, {info['memory_total_gib']} GiB RAM")
    L.append(f"- machine: {mach}")
    if "gpu" in info:
        L.append(f"- GPU: {info['gpu']} ({info['gpu_memory_gib']} GiB, {info.get('gpu_sms')} SMs, "
                 f"L2 {info.get('gpu_l2_mib')} MiB, sm_{info.get('gpu_capability', '?').replace('.', '')}), "
                 f"CUDA {info['cuda']}, cuDNN {info['cudnn']}")
    load = info["loadavg_at_start"]
    L.append(f"- torch {info['torch']}, Python {info['python']}, {info['platform']}")
    if "attn_ops" in info:
        L.append(f"- attn_ops {info['attn_ops']}, git {info['git_commit']}")
    L.append(f"- date: {info['date']}; load average at start: "
             f"{', '.join(f'{x:.2f}' for x in load) if load else 'n/a'}; "
             f"run took {elapsed_s / 60:.1f} min")
    L.append(f"- command: `{info['command']}`")
    unit, div = ("TFLOP/s", 1e3) if device == "cuda" else ("GFLOP/s", 1.0)
    mm = "; ".join(f"{c['dtype']} matmul {c['n']}x{c['n']}x{c['n']}: {c['gflops'] / div:.1f} {unit}"
                   for c in ceilings["matmul"])
    cp = ceilings["copy"]
    L.append(f"- measured ceilings (this run): {mm}; copy of {fmt_bytes(cp['bytes'])}: "
             f"{cp['gbps']:.1f} GB/s (bytes read + written)")
    return L


def write_outputs(args, markdown: str, payload: dict, *, final: bool = True) -> None:
    """Writes --out (markdown) and --json (payload) when given; called after every case too
    (final=False, quiet), so a run stopped by an outer time limit leaves its results so far."""
    for path, text in ((args.out, markdown + "\n"),
                       (args.json, None)):
        if not path:
            continue
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            if text is not None:
                f.write(text)
            else:
                json.dump(payload, f, indent=1, default=str)
        os.replace(tmp, path)
        if final:
            print(f"wrote {path}")


def skipped_lines(notes: dict) -> list[str]:
    """'Skipped or failed' list: notes maps (impl, status, why) -> case labels."""
    if not notes:
        return []
    L = ["", "Skipped or failed:"]
    for (impl, status, why), labels in notes.items():
        where = labels[0] if len(labels) == 1 else f"{len(labels)} cases, e.g. {labels[0]}"
        L.append(f"- {impl}: {status} ({where}): {why}")
    return L


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


def fmt_num(x: float) -> str:
    """3 significant-ish digits: 1234 -> '1234', 12.3 -> '12.3', 0.123 -> '0.12'."""
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 1 else f"{x:.2f}"


def fmt_time(seconds: float) -> str:
    """ms with 3 significant digits, or us below 0.1 ms."""
    ms = seconds * 1e3
    if ms >= 0.1:
        return f"{ms:.3g} ms" if ms < 1000 else f"{ms:.0f} ms"
    return f"{ms * 1e3:.3g} us"


# ------------------------------------------------- memory-bound cases (decode, cache writes)


def timed_entry(make_call: Callable[[], Callable[[], object]], *, device: str, args,
                nbytes: float, flush_l2: bool = True) -> tuple[dict, object]:
    """Builds a call (make_call(), outside the timing), times it (measure, with an L2 flush before
    each call on CUDA) and returns (entry, the call's last result). entry: {"status": "ok",
    "median_ms", "min_ms", "n", "gbps" (nbytes / median)} or, when building or running it raised,
    {"status": "OOM" | "n/a", "why"}."""
    try:
        call = make_call()
        m = measure(call, device=device, repeats=args.repeats, warmup=args.warmup,
                    budget_s=args.budget, flush_l2=flush_l2)
    except Exception as e:  # noqa: BLE001  (an implementation that rejects the case)
        return {"status": "OOM" if is_oom(e) else "n/a", "why": first_line(e)}, None
    return {"status": "ok", "median_ms": m["median_s"] * 1e3, "min_ms": m["min_s"] * 1e3,
            "n": m["n"], "gbps": nbytes / m["median_s"] / 1e9}, m["result"]


def bw_cell(entry: dict | None) -> str:
    """'0.123 ms (1234)': median time and GB/s, or the entry's status."""
    if entry is None:
        return "-"
    if entry["status"] != "ok":
        return entry["status"]
    return f"{fmt_time(entry['median_ms'] / 1e3)} ({fmt_num(entry['gbps'])})"


def time_ratio(impls: dict, impl: str, ref: str) -> str:
    """impls[impl] time / impls[ref] time ('> 1': ref is faster), or the status of the missing one."""
    a, o = impls.get(impl), impls.get(ref)
    if not a:
        return "-"
    if a["status"] != "ok":
        return a["status"]
    if not o or o["status"] != "ok":
        return "-"
    return f"{a['median_ms'] / o['median_ms']:.2f}"


def note(notes: dict, impl: str, entry: dict, label: str) -> None:
    """Prints and records a skipped / failed entry (notes: (impl, status, why) -> labels)."""
    if entry["status"] != "ok":
        print(f"  {label}: {impl} -> {entry['status']} ({entry['why']})", flush=True)
        notes.setdefault((impl, entry["status"], entry["why"]), []).append(label)


def paged_copies(dense: list[torch.Tensor], block_size: int, generator: torch.Generator,
                 extra_blocks: int = 2) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Paged copies of the caches in `dense` (each [B, capacity, ...], capacity a multiple of
    block_size): (pools [num_blocks, block_size, ...], one per cache, holding the blocks in one
    shuffled order with `extra_blocks` unused ones, and their block_table int32
    [B, capacity // block_size])."""
    b, cap = dense[0].shape[:2]
    nb = cap // block_size
    num_blocks = b * nb + extra_blocks
    perm = torch.randperm(num_blocks, generator=generator, device=dense[0].device)[:b * nb]
    pools = []
    for x in dense:
        pool = torch.empty(num_blocks, block_size, *x.shape[2:], dtype=x.dtype, device=x.device)
        pool[perm] = x.reshape(b * nb, block_size, *x.shape[2:])
        pools.append(pool)
    return pools, perm.reshape(b, nb).to(torch.int32)


def fits(nbytes: float, device: str, fraction: float = 0.8) -> bool:
    return nbytes <= fraction * available_memory_bytes(device)


def bandwidth_tables(results: list[dict], keys: list[tuple[str, Callable[[dict], object]]],
                     impls: list[str], copy_gbps: float, diffs: list[tuple[str, str]],
                     appends_intro: str) -> list[str]:
    """Markdown lines of a memory-bound benchmark (bench_decode.py, bench_mla.py): one row per
    case with the key columns, one cell per implementation (bw_cell), X/ours ratios, ours' share
    of the copy bandwidth, ours' sample count and the rel. diff columns (diffs: (header, row key));
    then, when the rows have "appends", a table of those."""
    header = [h for h, _ in keys] + impls + [f"{i}/ours" for i in impls if i != "ours"] + \
        ["ours % copy", "n"] + [h for h, _ in diffs]
    rows = []
    for r in results:
        o = r["impls"].get("ours", {})
        rows.append([f(r) for _, f in keys] + [bw_cell(r["impls"].get(i)) for i in impls] +
                    [time_ratio(r["impls"], i, "ours") for i in impls if i != "ours"] +
                    [f"{100 * o['gbps'] / copy_gbps:.0f}%" if o.get("status") == "ok" else "-",
                     o.get("n", "-")] +
                    [f"{r[k]:.1e}" if k in r else "-" for _, k in diffs])
    L = [markdown_table(header, [[str(c) for c in x] for x in rows])]
    names = []
    for r in results:
        names += [n for n in r.get("appends", {}) if n not in names]
    names.sort(key=lambda n: (n != "append", n))
    if names:
        L += ["", appends_intro, ""]
        rows = [[f(r) for h, f in keys if h != "cache"] + [bw_cell(r["appends"].get(n)) for n in names]
                for r in results]
        L.append(markdown_table([h for h, _ in keys if h != "cache"] + names,
                                [[str(c) for c in x] for x in rows]))
    return L


class Run:
    """What every benchmark script does around its cases: imports attn_ops, starts the
    --time-budget clock, describes the machine (printed), measures the ceilings, collects the
    notes of skipped / failed entries, and writes the report (after every case and at the end)."""

    def __init__(self, args, matmul_dtypes: list[str]):
        self.args = args
        self.device = args.device
        self.attn_ops = import_attn_ops()
        self.budget = Budget(args.time_budget)
        self.info = machine_info(self.device)
        self.info["attn_ops"] = (f"{getattr(self.attn_ops, '__version__', '?')} "
                                 f"({self.attn_ops.__file__})")
        info = self.info
        print(f"# machine: {info['cpu']}, {info['usable_cores']} cores, torch threads "
              f"{info['torch_threads']}, torch {info['torch']}" +
              (f", GPU {info['gpu']}" if "gpu" in info else ""), flush=True)
        if info["loadavg_at_start"] and info["loadavg_at_start"][0] > 0.5 * info["usable_cores"]:
            print(f"# WARNING: load average {info['loadavg_at_start'][0]:.1f} on "
                  f"{info['usable_cores']} cores: other processes are running, timings will be "
                  f"noisy", flush=True)
        self.ceilings = measure_ceilings(self.device, matmul_dtypes)
        self.notes: dict = {}

    def elapsed(self) -> float:
        return self.budget.elapsed()

    def over_budget(self, label: str, what: str = "all") -> bool:
        """True (and the case noted as skipped) once --time-budget is spent."""
        if not self.budget.expired():
            return False
        self.notes.setdefault((what, "skipped", f"--time-budget {self.args.time_budget:g} s spent"),
                              []).append(label)
        return True

    def each(self, cases: list, label_fn: Callable[..., str]):
        """Yields (index, case, label) for the cases, skipping (and noting) those that would
        start after --time-budget."""
        for ci, case in enumerate(cases):
            label = label_fn(*case)
            if not self.over_budget(label):
                yield ci, case, label

    def write(self, markdown: str, payload: dict, final: bool) -> str:
        payload = {"machine": self.info, "ceilings": self.ceilings, "elapsed_s": self.elapsed(),
                   "args": vars(self.args), **payload,
                   "notes": [{"impl": i, "status": s, "why": w, "cases": c}
                             for (i, s, w), c in self.notes.items()]}
        write_outputs(self.args, markdown, payload, final=final)
        if final:
            print()
            print(markdown)
        return markdown


def select_impls(args, cuda_impls: list[str], cpu_impls: list[str],
                 cuda_only: tuple[str, ...]) -> list[str]:
    """--impls (default: the device's list), CUDA-only ones dropped on CPU, "ours" always first."""
    impls = args.impls or (cuda_impls if args.device == "cuda" else cpu_impls)
    if args.device != "cuda":
        impls = [i for i in impls if i not in cuda_only]
    return impls if "ours" in impls else ["ours"] + impls


def all_oom(row: dict, impls: list[str], why: str, notes: dict, label: str) -> dict:
    """Marks every implementation of a case that does not fit in memory as OOM; returns row."""
    for impl in impls:
        row["impls"][impl] = {"status": "OOM", "why": why}
        note(notes, impl, row["impls"][impl], label)
    return row


def bw_line(label: str, row: dict, impls: list[str], diff_key: str, diff_name: str) -> str:
    """The progress line of a memory-bound case."""
    return (f"  {label}: " + ", ".join(f"{i} {bw_cell(row['impls'].get(i))}" for i in impls) +
            (f", {diff_name} {row[diff_key]:.1e}" if diff_key in row else ""))
