"""Timing of benchmark calls: host clock on CPU, CUDA events on a GPU (optionally with an L2 flush
before each call), CUDA-graph capture, and the whole-run time budget."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


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


def cpu_time_samples(fn: Callable[[], object], repeats: int) -> list[float]:
    """Process CPU times (seconds) of `repeats` calls after one untimed call. On a shared machine a call's
    wall time measures the queue; with one thread its CPU time measures the cycles the call itself took
    (memory stalls included), so two builds compared this way still rank."""
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        samples.append(time.process_time() - t0)
    return samples


def medians_in_turn(calls: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Host-clock median time of each call (CPU), the calls made in turn `rounds` times: the machine's drift
    hits them alike, so their ratios hold on a shared machine."""
    samples = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return {name: sorted(times)[rounds // 2] for name, times in samples.items()}


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
