"""Running a benchmark's cases: the Run object (machine description, ceilings, time budget, notes
of skipped / failed entries, report writing) and one timed entry of a memory-bound case, with its
failures classified (out of memory, rejected)."""

from __future__ import annotations

from typing import Callable

import torch

from machine import import_attn_ops, machine_info, measure_ceilings
from reporting import note, write_outputs
from timing import Budget, measure


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


def all_oom(row: dict, impls: list[str], why: str, notes: dict, label: str) -> dict:
    """Marks every implementation of a case that does not fit in memory as OOM; returns row."""
    for impl in impls:
        row["impls"][impl] = {"status": "OOM", "why": why}
        note(notes, impl, row["impls"][impl], label)
    return row


def is_oom(e: BaseException) -> bool:
    msg = str(e).lower()
    return (isinstance(e, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in msg
            or "can't allocate memory" in msg)


def first_line(e: BaseException, limit: int = 200) -> str:
    msg = str(e).strip()
    return msg.splitlines()[0][:limit] if msg else type(e).__name__
