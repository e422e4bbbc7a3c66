"""Benchmark attn_ops.attention against PyTorch's attention paths, side by side, in one run.

Compared on the same inputs (same values), each in its natural contiguous layout:
  ours      attn_ops.attention(q, k, v, causal=...)            q [B,T,Hq,D], k/v [B,T,Hkv,D] (BSHD)
  sdpa      F.scaled_dot_product_attention(..., enable_gqa=True) q [B,Hq,T,D], k/v [B,Hkv,T,D]
  eager     the HuggingFace "eager" path: repeat_kv (expand + reshape), q @ k^T * scale,
            + additive causal mask (precomputed, as HF does), softmax in float32, cast back, @ v
  on CUDA also (where they accept the case, else "n/a"):
  sdpa[flash] / sdpa[cudnn] / sdpa[efficient]   SDPA restricted with torch.nn.attention.sdpa_kernel
  flex      torch.compile(flex_attention) with a causal block mask and enable_gqa=True

Modes: fwd (forward only, under no_grad) and fwdbwd (forward + out.backward(grad), timed together).
Timing: warm-up, then the median of --repeats calls (time.perf_counter, torch.cuda.synchronize
on CUDA). To keep the default sweep affordable on a small CPU, a measurement stops repeating once
--budget seconds are spent (at least one sample), and on CPU a warm-up call longer than 1 s counts as
the first sample; the "n" column says how many samples each median has.
Baselines are skipped and marked (never ours; never plain sdpa, the reference, except on OOM):
  OOM   when the eager path's estimated memory (it materializes the [B, Hq, Tq, Tk] scores, ~12 bytes
        per score in forward and ~16 in forward+backward) exceeds --mem-limit-gb (default: 60% of the
        memory available), or when the run raised an out-of-memory error;
  slow  when its rate measured on a smaller case of the same mode/dtype predicts one call longer
        than --max-run-seconds (e.g. eager bfloat16 on CPUs without native bfloat16 matmul);
  n/a   when it raised an error (the reason is listed under the table).
FLOPs convention (FlashAttention's): forward = 4 * B * Hq * Tq * Tk * D, halved for causal;
forward+backward = 3.5 x forward. Every implementation is credited with the same count (so the
eager path, which computes the masked half too, shows the rate a user effectively gets).
Ratios are baseline_time / ours_time: > 1 means attn_ops is faster.
"rel. diff vs sdpa": max |ours - sdpa| / max |sdpa| of the forward output (fwd), or the largest
of that over dq, dk, dv (fwdbwd).

The full default sweep (the issue's: fwd and fwdbwd, float32 and bfloat16, B in {1, 4},
T in {512, 2048, 4096}, Hq 32, Hkv in {32, 8, 1}, D 128, causal) is dominated by the largest
cases. On a 2-core AVX2 CPU it cannot fit in 20 minutes even with one sample per huge case: SDPA's
own bfloat16 backward runs at only 6-12 GFLOP/s there, ~20 min for its share alone (estimate from
--quick rates: ~35-40 min in all). Eager bfloat16 (bfloat16 matmul ~1 GFLOP/s on such CPUs) is
mostly skipped as "slow". Use --mode/--dtype/--batch/--seqlen/--hkv to split it, --quick for a
smoke test.

Examples:
  python benchmarks/bench_attention.py --quick
  python benchmarks/bench_attention.py --batch 1 --seqlen 2048 --hkv 8 --dtype float32 --mode both
  python benchmarks/bench_attention.py --out benchmarks/results/cpu_attention.md --json results.json
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CPU_IMPLS = ["ours", "sdpa", "eager"]
CUDA_IMPLS = ["ours", "sdpa", "sdpa[flash]", "sdpa[cudnn]", "sdpa[efficient]", "flex", "eager"]
BASELINE_MEM_BYTES_PER_SCORE = {"fwd": 12, "fwdbwd": 16}


# ------------------------------------------------------------------------- implementations


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """HuggingFace's repeat_kv: [B, Hkv, T, D] -> [B, Hkv * n_rep, T, D] (a copy)."""
    b, hkv, t, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, hkv, n_rep, t, d).reshape(b, hkv * n_rep, t, d)


def eager_attention(q, k, v, mask, scale):
    """HuggingFace's eager_attention_forward (dropout 0), on [B, H, T, D] tensors."""
    n_rep = q.shape[1] // k.shape[1]
    k = repeat_kv(k, n_rep)
    v = repeat_kv(v, n_rep)
    w = torch.matmul(q, k.transpose(2, 3)) * scale
    if mask is not None:
        w = w + mask
    w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(w, v)


def causal_additive_mask(tq, tk, dtype, device):
    """[1, 1, Tq, Tk] additive mask, bottom-right aligned, as HF builds it (outside attention)."""
    i = torch.arange(tq, device=device)[:, None]
    j = torch.arange(tk, device=device)[None, :]
    visible = j <= i + (tk - tq)
    mask = torch.zeros(tq, tk, dtype=dtype, device=device)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[None, None]


_FLEX = {}


def flex_compiled():
    if "fn" not in _FLEX:
        from torch.nn.attention.flex_attention import flex_attention

        # every new shape is a recompile; the sweep has dozens of them
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 1024)
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX["fn"]


def make_forward(impl, attn_ops, t, causal, device):
    """Returns (forward(q, k, v) -> out, layout) where layout is 'bshd' or 'bhsd'; all setup that a
    model would do once (masks, compilation handles) happens here, outside the timed call."""
    b, tq, hq, d = t["q_bshd"].shape
    tk = t["k_bshd"].shape[1]
    scale = 1.0 / math.sqrt(d)
    if impl == "ours":
        return (lambda q, k, v: attn_ops.attention(q, k, v, causal=causal)[0]), "bshd"
    if impl == "sdpa":
        return (lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, is_causal=causal, enable_gqa=True)), "bhsd"
    if impl.startswith("sdpa["):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                   "efficient": SDPBackend.EFFICIENT_ATTENTION}[impl[5:-1]]

        def fwd(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

        return fwd, "bhsd"
    if impl == "flex":
        from torch.nn.attention.flex_attention import create_block_mask

        block_mask = None
        if causal:
            off = tk - tq

            def causal_mod(b_, h_, q_idx, kv_idx):
                return kv_idx <= q_idx + off

            block_mask = create_block_mask(causal_mod, B=None, H=None, Q_LEN=tq, KV_LEN=tk,
                                           device=device)
        fn = flex_compiled()
        return (lambda q, k, v: fn(q, k, v, block_mask=block_mask, enable_gqa=True)), "bhsd"
    if impl == "eager":
        mask = causal_additive_mask(tq, tk, t["q_bshd"].dtype, device) if causal else None
        return (lambda q, k, v: eager_attention(q, k, v, mask, scale)), "bhsd"
    raise ValueError(f"unknown implementation {impl!r}")


def run_impl(impl, attn_ops, t, mode, causal, device, args):
    """Times one implementation on one case. Returns a dict with median_s, n, and the tensors to
    compare (forward output, or dq/dk/dv), all in BSHD layout."""
    fwd, layout = make_forward(impl, attn_ops, t, causal, device)
    q, k, v, g = (t[f"{n}_{layout}"] for n in ("q", "k", "v", "g"))
    if mode == "fwd":
        def call():
            with torch.no_grad():
                return fwd(q, k, v)
    else:
        q, k, v = (x.detach().requires_grad_() for x in (q, k, v))

        def call():
            q.grad = k.grad = v.grad = None
            fwd(q, k, v).backward(g)

    if impl == "flex":
        call()  # compiles; never let the CPU "long first call counts" rule time compilation
    m = common.measure(call, device=device, repeats=args.repeats, warmup=args.warmup,
                       budget_s=args.budget)
    to_bshd = (lambda x: x) if layout == "bshd" else (lambda x: x.transpose(1, 2))
    if mode == "fwd":
        compare = [to_bshd(m["result"])]
    else:
        compare = [to_bshd(x.grad) for x in (q, k, v)]
    return {"median_s": m["median_s"], "min_s": m["min_s"], "n": m["n"], "compare": compare}


# ------------------------------------------------------------------------------- the sweep


def flops(b, hq, tq, tk, d, causal, mode):
    f = 4.0 * b * hq * tq * tk * d
    if causal:
        f /= 2
    return f * (3.5 if mode == "fwdbwd" else 1.0)


def make_inputs(b, t, hq, hkv, d, dtype, device, seed):
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)

    q, k, v, g = rnd(b, t, hq, d), rnd(b, t, hkv, d), rnd(b, t, hkv, d), rnd(b, t, hq, d)
    out = {}
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g)):
        out[f"{name}_bshd"] = x.contiguous()
        out[f"{name}_bhsd"] = x.transpose(1, 2).contiguous()
    return out


def rel_maxdiff(a: torch.Tensor, ref: torch.Tensor) -> float:
    """max |a - ref| / max |ref| (0 for empty tensors)."""
    if a.numel() == 0:
        return 0.0
    return float((a - ref).abs().max()) / max(float(ref.abs().max()), 1e-30)


def is_oom(e: BaseException) -> bool:
    msg = str(e).lower()
    return (isinstance(e, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in msg
            or "can't allocate memory" in msg)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", action="append", choices=sorted(DTYPES),
                   help="repeatable; default float32 and bfloat16")
    p.add_argument("--mode", default="both", choices=["fwd", "fwdbwd", "both"])
    p.add_argument("--batch", type=int, nargs="+", help="default 1 4")
    p.add_argument("--seqlen", type=int, nargs="+", help="Tq = Tk; default 512 2048 4096")
    p.add_argument("--hq", type=int, default=32)
    p.add_argument("--hkv", type=int, nargs="+", help="default 32 8 1")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--quick", action="store_true",
                   help="smoke test: B 1, T 512, Hkv 8 and 1, 3 repeats (explicit flags win)")
    p.add_argument("--impls", nargs="+",
                   help=f"subset to run; default cpu {CPU_IMPLS}, cuda {CUDA_IMPLS}")
    p.add_argument("--repeats", type=int, default=None, help="samples per median (default 5)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--budget", type=float, default=5.0,
                   help="stop repeating a measurement after this many seconds (>= 1 sample)")
    p.add_argument("--max-run-seconds", type=float, default=30.0,
                   help="skip a baseline whose predicted single call is longer ('slow')")
    p.add_argument("--mem-limit-gb", type=float, default=None,
                   help="skip the eager baseline above this estimated memory (default 60%% of "
                        "available memory, re-read for every case)")
    p.add_argument("--no-check", action="store_true", help="skip the 'rel. diff vs sdpa' column")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the markdown report here")
    p.add_argument("--json", help="write the raw results here")
    args = p.parse_args(argv)

    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but torch.cuda.is_available() is False")
    quick = args.quick
    args.dtype = args.dtype or ["float32", "bfloat16"]
    args.batch = args.batch or ([1] if quick else [1, 4])
    args.seqlen = args.seqlen or ([512] if quick else [512, 2048, 4096])
    args.hkv = args.hkv or ([8, 1] if quick else [32, 8, 1])
    args.repeats = args.repeats or (3 if quick else 5)
    args.modes = ["fwd", "fwdbwd"] if args.mode == "both" else [args.mode]
    args.impls = args.impls or (CUDA_IMPLS if args.device == "cuda" else CPU_IMPLS)
    if "ours" not in args.impls:
        args.impls = ["ours"] + args.impls
    for hkv in args.hkv:
        if hkv < 1 or args.hq % hkv:
            p.error(f"--hq {args.hq} must be a multiple of every --hkv (got {hkv})")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = args.device
    attn_ops = common.import_attn_ops()
    t_start = time.perf_counter()

    info = common.machine_info(device)
    info["attn_ops"] = f"{getattr(attn_ops, '__version__', '?')} ({attn_ops.__file__})"
    print(f"# machine: {info['cpu']}, {info['usable_cores']} cores, torch threads "
          f"{info['torch_threads']}, torch {info['torch']}" +
          (f", GPU {info['gpu']}" if "gpu" in info else ""), flush=True)
    if info["loadavg_at_start"] and info["loadavg_at_start"][0] > 0.5 * info["usable_cores"]:
        print(f"# WARNING: load average {info['loadavg_at_start'][0]:.1f} on "
              f"{info['usable_cores']} cores: other processes are running, timings will be noisy",
              flush=True)

    ceilings = {"matmul": [], "copy": None}
    for dt in ["float32"] + [x for x in args.dtype if x != "float32"]:
        c = common.matmul_ceiling(device, DTYPES[dt], n_max=8192 if device == "cuda" else 4096)
        ceilings["matmul"].append(c)
        print(f"# ceiling: {dt} matmul {c['n']}^3: {c['gflops']:.1f} GFLOP/s", flush=True)
    ceilings["copy"] = common.copy_ceiling(device)
    print(f"# ceiling: copy {common.fmt_bytes(ceilings['copy']['bytes'])}: "
          f"{ceilings['copy']['gbps']:.1f} GB/s (read + write)", flush=True)

    cases = [(mode, dt, b, t, hkv) for dt in args.dtype for mode in args.modes
             for b in args.batch for t in sorted(args.seqlen) for hkv in args.hkv]
    best_rate = {}  # (impl, mode, dtype) -> best flop/s seen, for the 'slow' guard
    results, notes = [], {}  # (impl, status, why) -> case labels
    hq, d = args.hq, args.head_dim

    for ci, (mode, dt, b, t, hkv) in enumerate(cases):
        dtype = DTYPES[dt]
        fl = flops(b, hq, t, t, d, args.causal, mode)
        label = f"{mode} {dt} B={b} T={t} Hq={hq} Hkv={hkv} D={d}"
        inputs = make_inputs(b, t, hq, hkv, d, dtype, device, args.seed + ci)
        row = {"mode": mode, "dtype": dt, "B": b, "T": t, "Hq": hq, "Hkv": hkv, "D": d,
               "causal": args.causal, "flops": fl, "impls": {}}
        compare = {}
        for impl in args.impls:
            entry = {}
            predicted = fl / best_rate[(impl, mode, dt)] if (impl, mode, dt) in best_rate else 0.0
            mem_limit = (args.mem_limit_gb * common.GiB if args.mem_limit_gb is not None
                         else 0.6 * common.available_memory_bytes(device))
            est = (b * hq * t * t * BASELINE_MEM_BYTES_PER_SCORE[mode]) if impl == "eager" else 0
            if impl != "ours" and est > mem_limit:
                entry = {"status": "OOM", "why": f"estimated {common.fmt_bytes(est)} for the "
                         f"score matrices > limit {common.fmt_bytes(mem_limit)}"}
            elif impl not in ("ours", "sdpa") and predicted > args.max_run_seconds:
                entry = {"status": "slow", "why": f"predicted {predicted:.0f} s per call from its "
                         f"rate on a smaller case > --max-run-seconds {args.max_run_seconds:g}"}
            else:
                try:
                    r = run_impl(impl, attn_ops, inputs, mode, args.causal, device, args)
                    entry = {"status": "ok", "median_ms": r["median_s"] * 1e3,
                             "min_ms": r["min_s"] * 1e3, "n": r["n"],
                             "gflops": fl / r["median_s"] / 1e9}
                    key = (impl, mode, dt)
                    best_rate[key] = max(best_rate.get(key, 0.0), fl / r["median_s"])
                    if not args.no_check and impl in ("ours", "sdpa"):
                        compare[impl] = [x.detach().float() for x in r["compare"]]
                    del r
                except Exception as e:  # noqa: BLE001  (a baseline that rejects the case)
                    if impl == "ours" and not is_oom(e):
                        raise
                    msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
                    entry = {"status": "OOM" if is_oom(e) else "n/a", "why": msg}
            if entry["status"] != "ok":
                print(f"  {label}: {impl} -> {entry['status']} ({entry['why']})", flush=True)
                notes.setdefault((impl, entry["status"], entry["why"]), []).append(label)
            row["impls"][impl] = entry
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
        if "ours" in compare and "sdpa" in compare:
            row["maxdiff_vs_sdpa"] = max(rel_maxdiff(a, s)
                                         for a, s in zip(compare["ours"], compare["sdpa"]))
        del inputs, compare
        gc.collect()
        results.append(row)
        print(format_row_line(row, args.impls), flush=True)

    elapsed = time.perf_counter() - t_start
    report = render_markdown(info, ceilings, args, results, notes, elapsed)
    print()
    print(report)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(report + "\n")
        print(f"wrote {args.out}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"machine": info, "ceilings": ceilings, "elapsed_s": elapsed,
                       "args": {k: v for k, v in vars(args).items()}, "results": results,
                       "notes": [{"impl": i, "status": st, "why": w, "cases": c}
                                 for (i, st, w), c in notes.items()]}, f, indent=1)
        print(f"wrote {args.json}")
    return 0


# -------------------------------------------------------------------------------- reporting


def rate_unit(device):
    return ("TFLOP/s", 1e3) if device == "cuda" else ("GFLOP/s", 1.0)


def cell(entry, device):
    if entry is None:
        return "-"
    if entry["status"] != "ok":
        return entry["status"]
    unit, div = rate_unit(device)
    rate = entry["gflops"] / div
    rate_s = f"{rate:.0f}" if rate >= 100 else f"{rate:.1f}" if rate >= 1 else f"{rate:.2f}"
    return f"{entry['median_ms']:.1f} ({rate_s})"


def ratio(row, impl):
    a, o = row["impls"].get(impl), row["impls"].get("ours")
    if not a or not o or a["status"] != "ok" or o["status"] != "ok":
        return (a or {}).get("status", "-") if a else "-"
    return f"{a['median_ms'] / o['median_ms']:.2f}"


def format_row_line(row, impls):
    head = f"{row['mode']:6s} {row['dtype']:8s} B={row['B']} T={row['T']} Hkv={row['Hkv']}: "
    parts = []
    for impl in impls:
        e = row["impls"].get(impl)
        parts.append(f"{impl} {e['median_ms']:.1f} ms" if e and e["status"] == "ok"
                     else f"{impl} {e['status'] if e else '-'}")
    for impl in impls[1:]:
        parts.append(f"{impl}/ours {ratio(row, impl)}")
    if "maxdiff_vs_sdpa" in row:
        parts.append(f"rel.diff {row['maxdiff_vs_sdpa']:.1e}")
    return "  " + head + ", ".join(parts)


def render_markdown(info, ceilings, args, results, notes, elapsed):
    device = args.device
    impls = args.impls
    L = ["# attn_ops.attention benchmark", ""]
    mach = (f"{info['cpu']}, {info['usable_cores']} usable cores ({info['logical_cores']} logical), "
            f"torch.get_num_threads() = {info['torch_threads']}, CPU capability "
            f"{info['cpu_capability']}, {info['memory_total_gib']} GiB RAM")
    L.append(f"- machine: {mach}")
    if "gpu" in info:
        L.append(f"- GPU: {info['gpu']} ({info['gpu_memory_gib']} GiB), CUDA {info['cuda']}, "
                 f"cuDNN {info['cudnn']}")
    load = info["loadavg_at_start"]
    L.append(f"- torch {info['torch']}, Python {info['python']}, {info['platform']}")
    L.append(f"- attn_ops {info['attn_ops']}, git {info['git_commit']}")
    L.append(f"- date: {info['date']}; load average at start: "
             f"{', '.join(f'{x:.2f}' for x in load) if load else 'n/a'}; sweep took {elapsed / 60:.1f} min")
    L.append(f"- command: `{info['command']}`")
    unit, div = rate_unit(device)
    mm = "; ".join(f"{c['dtype']} matmul {c['n']}x{c['n']}x{c['n']}: {c['gflops'] / div:.1f} {unit}"
                   for c in ceilings["matmul"])
    cp = ceilings["copy"]
    L.append(f"- measured ceilings (this run): {mm}; copy of {common.fmt_bytes(cp['bytes'])}: "
             f"{cp['gbps']:.1f} GB/s (bytes read + written)")
    L.append("")
    L.append(f"Cells: median time in ms ({unit}). FLOPs: forward = 4·B·Hq·Tq·Tk·D, halved for "
             f"causal; fwdbwd = 3.5 × forward (FlashAttention's convention); every implementation "
             f"is credited with the same count. X/ours = X time / ours time (> 1: attn_ops is faster). "
             f"causal = {args.causal}. Layouts: ours BSHD contiguous, the others [B, H, T, D] "
             f"contiguous. fwdbwd times forward + out.backward(grad). n = samples in ours' median "
             f"(max {args.repeats}, fewer when one call is long; see the script's docstring). "
             f"rel. diff vs sdpa: max abs(ours - sdpa) / max abs(sdpa), forward output (fwd) or the "
             f"largest over dq, dk, dv (fwdbwd).")
    L.append("")
    header = ["mode", "dtype", "B", "T", "Hq", "Hkv", "D"] + impls + \
        [f"{i}/ours" for i in impls if i != "ours"] + ["n", "rel. diff vs sdpa"]
    rows = []
    for r in results:
        o = r["impls"].get("ours", {})
        rows.append([r["mode"], r["dtype"], r["B"], r["T"], r["Hq"], r["Hkv"], r["D"]] +
                    [cell(r["impls"].get(i), device) for i in impls] +
                    [ratio(r, i) for i in impls if i != "ours"] +
                    [o.get("n", "-"),
                     f"{r['maxdiff_vs_sdpa']:.1e}" if "maxdiff_vs_sdpa" in r else "-"])
    L.append(common.markdown_table(header, [[str(c) for c in row] for row in rows]))
    if notes:
        L.append("")
        L.append("Skipped or failed:")
        for (impl, status, why), labels in notes.items():
            where = labels[0] if len(labels) == 1 else f"{len(labels)} cases, e.g. {labels[0]}"
            L.append(f"- {impl}: {status} ({where}): {why}")
    return "\n".join(L)


if __name__ == "__main__":
    sys.exit(main())
