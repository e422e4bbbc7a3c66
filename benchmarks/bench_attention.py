"""Benchmark attn_ops.attention against PyTorch's attention paths, side by side, in one run.

Compared on the same inputs (same values), each in its natural contiguous layout:
  ours      attn_ops.attention(q, k, v, causal=...)            q [B,T,Hq,D], k/v [B,T,Hkv,D] (BSHD)
  sdpa      F.scaled_dot_product_attention(..., enable_gqa=True) q [B,Hq,T,D], k/v [B,Hkv,T,D]
  eager     the HuggingFace "eager" path: repeat_kv (expand + reshape), q @ k^T * scale,
            + additive causal mask (precomputed, as HF does), softmax in float32, cast back, @ v
  on CUDA also (where they accept the case, else "n/a"):
  sdpa[flash] / sdpa[cudnn] / sdpa[efficient]   SDPA restricted to one backend with
            torch.nn.attention.sdpa_kernel. GQA (Hkv < Hq): enable_gqa=True when the backend takes
            it; when it rejects it, K/V are repeated to Hq heads (HF's repeat_kv) inside the timed
            call and the cell is marked "*" (the json says "gqa": "enable_gqa" | "repeat_kv").
  flex      torch.compile(flex_attention), a causal block mask (create_block_mask, built once per
            case, outside the timed call) and enable_gqa=True

Modes: fwd (forward only, under no_grad) and fwdbwd (forward + out.backward(grad), timed together).
Timing: warm-up, then the median of --repeats calls. CPU: time.perf_counter around each call. CUDA:
CUDA events around each call on the current stream (timing.measure_cuda; warm-up calls first, so
compilation and autotuning stay out). To keep a sweep affordable, a measurement stops repeating once
--budget seconds are spent (at least one sample), and on CPU a warm-up call longer than 1 s counts as
the first sample; the "n" column says how many samples each median has. --time-budget bounds the
whole run: cases that would start later are skipped and listed, the report is still written (and
--out / --json are rewritten after every case).
Baselines are skipped and marked (never ours; never plain sdpa, the reference, except on OOM):
  OOM   when the eager path's estimated memory (it materializes the [B, Hq, Tq, Tk] scores, ~12 bytes
        per score in forward and ~16 in forward+backward) exceeds --mem-limit-gb (default: 60% of the
        memory available), or when the run raised an out-of-memory error;
  slow  when its rate measured on a smaller case of the same mode/dtype predicts one call longer
        than --max-run-seconds (e.g. eager bfloat16 on CPUs without native bfloat16 matmul);
  n/a   when it raised an error (the reason is listed under the table).
FLOPs convention (FlashAttention's): forward = 2 * B * Hq * Tq * Tk * (Dqk + Dv) (= 4 B Hq Tq Tk D),
halved for causal; forward+backward = 3.5 x forward. Every implementation is credited with the same
count (so the eager path, which computes the masked half too, shows the rate a user effectively gets).
Ratios are baseline_time / ours_time: > 1 means attn_ops is faster. On CUDA, "ours % mm" is our rate
over the dense matmul rate of the same dtype measured in the same run.
"rel. diff vs sdpa": max |ours - sdpa| / max |sdpa| of the forward output (fwd), or the largest
of that over dq, dk, dv (fwdbwd).

Defaults. CPU: float32 and bfloat16, causal, D 128, B in {1, 4}, T in {512, 2048, 4096}, Hq 32,
Hkv in {32, 8, 1}. CUDA: bfloat16, causal and not, D 128 and 192/128 (Dqk/Dv, DeepSeek MLA
training), T in {1024, 4096, 16384} with B = --tokens / T (16384 tokens: B 16, 4, 1), Hq 32,
Hkv in {32, 8, 1}.

The full CPU sweep is dominated by the largest cases. On a 2-core AVX2 CPU it cannot fit in 20
minutes even with one sample per huge case: SDPA's own bfloat16 backward runs at only 6-12 GFLOP/s
there, ~20 min for its share alone (estimate from --quick rates: ~35-40 min in all). Eager bfloat16
(bfloat16 matmul ~1 GFLOP/s on such CPUs) is mostly skipped as "slow". Use
--mode/--dtype/--batch/--seqlen/--hkv to split it, --quick for a smoke test. The full CUDA sweep
(72 cases) is mostly FlexAttention compilation (one compile per shape and mode); --quick runs 4.

Examples:
  python benchmarks/bench_attention.py --quick
  python benchmarks/bench_attention.py --batch 1 --seqlen 2048 --hkv 8 --dtype float32 --mode both
  python benchmarks/bench_attention.py --out report.md --json report.json
  python benchmarks/bench_attention.py --device cuda --out benchmarks/results/h100_attention.md \\
      --json benchmarks/results/h100_attention.json
  python benchmarks/bench_attention.py --device cuda --quick --time-budget 120
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import baselines  # noqa: E402
import cli  # noqa: E402
import machine  # noqa: E402
import reporting  # noqa: E402
import runner  # noqa: E402
import timing  # noqa: E402
from baselines import DTYPES, eager_attention, rel_maxdiff, repeat_kv  # noqa: E402
from runner import is_oom  # noqa: E402

CPU_IMPLS = ["ours", "sdpa", "eager"]
CUDA_IMPLS = ["ours", "sdpa", "sdpa[flash]", "sdpa[cudnn]", "sdpa[efficient]", "flex", "eager"]
BASELINE_MEM_BYTES_PER_SCORE = {"fwd": 12, "fwdbwd": 16}


# ------------------------------------------------------------------------- implementations


def causal_additive_mask(tq, tk, dtype, device):
    """[1, 1, Tq, Tk] additive mask, bottom-right aligned, as HF builds it (outside attention)."""
    i = torch.arange(tq, device=device)[:, None]
    j = torch.arange(tk, device=device)[None, :]
    visible = j <= i + (tk - tq)
    mask = torch.zeros(tq, tk, dtype=dtype, device=device)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[None, None]


def make_forward(impl, attn_ops, t, causal, device, gqa="enable_gqa"):
    """Returns (forward(q, k, v) -> out, layout) where layout is 'bshd' or 'bhsd'; all setup that a
    model would do once (masks, compilation handles) happens here, outside the timed call.
    gqa (SDPA backends): "enable_gqa", or "repeat_kv" to repeat K/V to Hq heads in the call."""
    b, tq, hq, d = t["q_bshd"].shape
    tk = t["k_bshd"].shape[1]
    scale = 1.0 / math.sqrt(d)
    if impl == "ours":
        return (lambda q, k, v: attn_ops.attention(q, k, v, causal=causal)[0]), "bshd"
    if impl == "sdpa":
        return (lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, is_causal=causal, enable_gqa=True)), "bhsd"
    if impl.startswith("sdpa["):
        backend = impl[5:-1]

        def fwd(q, k, v):
            with baselines.sdpa_backend(backend):
                if gqa == "repeat_kv":
                    n_rep = q.shape[1] // k.shape[1]
                    return F.scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep),
                                                          is_causal=causal)
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
        fn = baselines.flex_compiled()
        return (lambda q, k, v: fn(q, k, v, block_mask=block_mask, enable_gqa=True)), "bhsd"
    if impl == "eager":
        mask = causal_additive_mask(tq, tk, t["q_bshd"].dtype, device) if causal else None
        return (lambda q, k, v: eager_attention(q, k, v, mask, scale)), "bhsd"
    raise ValueError(f"unknown implementation {impl!r}")


def make_call(impl, attn_ops, t, mode, causal, device, gqa="enable_gqa"):
    """(call, tensors to compare after a call, layout): call() runs the forward (fwd, no_grad) or
    forward + backward (fwdbwd)."""
    fwd, layout = make_forward(impl, attn_ops, t, causal, device, gqa)
    q, k, v, g = (t[f"{n}_{layout}"] for n in ("q", "k", "v", "g"))
    if mode == "fwd":
        def call():
            with torch.no_grad():
                return fwd(q, k, v)
        return call, None, layout
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))

    def call():
        q.grad = k.grad = v.grad = None
        fwd(q, k, v).backward(g)

    return call, (q, k, v), layout


def run_impl(impl, attn_ops, t, mode, causal, device, args):
    """Times one implementation on one case. Returns a dict with median_s, n, gqa (SDPA backends
    with Hkv < Hq), and the tensors to compare (forward output, or dq/dk/dv), in BSHD layout."""
    hq, hkv = t["q_bshd"].shape[2], t["k_bshd"].shape[2]
    gqa = "enable_gqa" if hq != hkv else "native"
    call, leaves, layout = make_call(impl, attn_ops, t, mode, causal, device)
    if impl.startswith("sdpa[") and hq != hkv:
        # Does this backend take enable_gqa=True for this case? Else repeat K/V in the call.
        try:
            call()
        except RuntimeError as e:
            if is_oom(e):
                raise
            gqa = "repeat_kv"
            call, leaves, layout = make_call(impl, attn_ops, t, mode, causal, device, gqa)
    if impl == "flex":
        call()  # compiles; never let the CPU "long first call counts" rule time compilation
    m = timing.measure(call, device=device, repeats=args.repeats, warmup=args.warmup,
                       budget_s=args.budget)
    to_bshd = (lambda x: x) if layout == "bshd" else (lambda x: x.transpose(1, 2))
    if mode == "fwd":
        compare = [to_bshd(m["result"])]
    else:
        compare = [to_bshd(x.grad) for x in leaves]
    return {"median_s": m["median_s"], "min_s": m["min_s"], "n": m["n"], "compare": compare,
            "gqa": gqa}


# ------------------------------------------------------------------------------- the sweep


def flops(b, hq, tq, tk, dqk, dv, causal, mode):
    f = 2.0 * b * hq * tq * tk * (dqk + dv)
    if causal:
        f /= 2
    return f * (3.5 if mode == "fwdbwd" else 1.0)


def make_inputs(b, t, hq, hkv, dqk, dv, dtype, device, seed):
    """q, k, v, g (the incoming gradient) in BSHD and [B, H, T, D], same values. CPU: drawn with a
    CPU generator in float32, then cast; CUDA: drawn on the GPU."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32,
                           device=device).to(dtype=dtype)

    q, k, v, g = rnd(b, t, hq, dqk), rnd(b, t, hkv, dqk), rnd(b, t, hkv, dv), rnd(b, t, hq, dv)
    out = {}
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g)):
        out[f"{name}_bshd"] = x.contiguous()
        out[f"{name}_bhsd"] = x.transpose(1, 2).contiguous()
    return out


def head_dims(text):
    """'128' -> (128, 128); '192/128' -> (192, 128)."""
    parts = text.split("/")
    try:
        dims = tuple(int(x) for x in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"head dim must be D or Dqk/Dv, got {text!r}") from None
    if len(dims) not in (1, 2) or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"head dim must be D or Dqk/Dv, got {text!r}")
    return dims if len(dims) == 2 else dims * 2


def dims_label(dqk, dv):
    return str(dqk) if dqk == dv else f"{dqk}/{dv}"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_common_args(p)
    p.add_argument("--dtype", action="append", choices=sorted(DTYPES),
                   help="repeatable; default: CPU float32 and bfloat16, CUDA bfloat16")
    p.add_argument("--mode", default="both", choices=["fwd", "fwdbwd", "both"])
    p.add_argument("--batch", type=int, nargs="+", help="default 1 4 (CPU); see --tokens")
    p.add_argument("--tokens", type=int, default=None,
                   help="B = tokens / T for every T (default: CUDA 16384; CPU unset, --batch)")
    p.add_argument("--seqlen", type=int, nargs="+",
                   help="Tq = Tk; default: CPU 512 2048 4096, CUDA 1024 4096 16384")
    p.add_argument("--hq", type=int, default=32)
    p.add_argument("--hkv", type=int, nargs="+", help="default 32 8 1")
    p.add_argument("--head-dim", type=head_dims, nargs="+",
                   help="D or Dqk/Dv, e.g. 128 192/128; default: CPU 128, CUDA 128 192/128")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None,
                   help="only causal (--causal) or only not (--no-causal); default: CPU causal, "
                        "CUDA both")
    p.add_argument("--quick", action="store_true",
                   help="smoke test (explicit flags win): CPU B 1, T 512, Hkv 8 and 1, 3 repeats; "
                        "CUDA T 4096 (B 4), Hkv 8, D 128 and 192/128, causal, 10 repeats")
    p.add_argument("--impls", nargs="+",
                   help=f"subset to run; default cpu {CPU_IMPLS}, cuda {CUDA_IMPLS}")
    p.add_argument("--max-run-seconds", type=float, default=30.0,
                   help="skip a baseline whose predicted single call is longer ('slow')")
    p.add_argument("--mem-limit-gb", type=float, default=None,
                   help="skip the eager baseline above this estimated memory (default 60%% of "
                        "available memory, re-read for every case)")
    p.add_argument("--no-check", action="store_true", help="skip the 'rel. diff vs sdpa' column")
    args = p.parse_args(argv)

    cli.finish_common_args(p, args)
    quick, cuda = args.quick, args.device == "cuda"
    args.dtype = args.dtype or (["bfloat16"] if cuda else ["float32", "bfloat16"])
    if args.tokens is None and cuda and not args.batch:
        args.tokens = 16384
    args.batch = args.batch or ([1] if quick else [1, 4])
    if cuda:
        args.seqlen = args.seqlen or ([4096] if quick else [1024, 4096, 16384])
        args.hkv = args.hkv or ([8] if quick else [32, 8, 1])
        args.head_dim = args.head_dim or [(128, 128), (192, 128)]
        args.causal_modes = [args.causal] if args.causal is not None else \
            ([True] if quick else [True, False])
    else:
        args.seqlen = args.seqlen or ([512] if quick else [512, 2048, 4096])
        args.hkv = args.hkv or ([8, 1] if quick else [32, 8, 1])
        args.head_dim = args.head_dim or [(128, 128)]
        args.causal_modes = [True if args.causal is None else args.causal]
    args.modes = ["fwd", "fwdbwd"] if args.mode == "both" else [args.mode]
    args.impls = args.impls or (CUDA_IMPLS if cuda else CPU_IMPLS)
    if "ours" not in args.impls:
        args.impls = ["ours"] + args.impls
    for hkv in args.hkv:
        if hkv < 1 or args.hq % hkv:
            p.error(f"--hq {args.hq} must be a multiple of every --hkv (got {hkv})")
    if args.tokens is not None:
        for t in args.seqlen:
            if args.tokens % t:
                p.error(f"--tokens {args.tokens} must be a multiple of every --seqlen (got {t})")
    return args


def batches_for(args, t):
    return [args.tokens // t] if args.tokens is not None else args.batch


def main(argv=None) -> int:
    args = parse_args(argv)
    device = args.device
    run = runner.Run(args, args.dtype)
    attn_ops, budget, notes = run.attn_ops, run.budget, run.notes

    cases = [(mode, dt, causal, (dqk, dv), b, t, hkv)
             for dt in args.dtype for causal in args.causal_modes for (dqk, dv) in args.head_dim
             for mode in args.modes for t in sorted(args.seqlen) for b in batches_for(args, t)
             for hkv in args.hkv]
    best_rate = {}  # (impl, mode, dtype) -> best flop/s seen, for the 'slow' guard
    results = []
    hq = args.hq

    def report(final):
        return run.write(render_markdown(run.info, run.ceilings, args, results, notes,
                                         run.elapsed()), {"results": results}, final)

    for ci, (mode, dt, causal, (dqk, dv), b, t, hkv) in enumerate(cases):
        dtype = DTYPES[dt]
        fl = flops(b, hq, t, t, dqk, dv, causal, mode)
        label = (f"{mode} {dt} {'causal' if causal else 'full'} B={b} T={t} Hq={hq} Hkv={hkv} "
                 f"D={dims_label(dqk, dv)}")
        if run.over_budget(label):
            continue
        inputs = make_inputs(b, t, hq, hkv, dqk, dv, dtype, device, args.seed + ci)
        row = {"mode": mode, "dtype": dt, "B": b, "T": t, "Hq": hq, "Hkv": hkv, "D": dqk,
               "Dv": dv, "causal": causal, "flops": fl, "impls": {}}
        compare = {}
        for impl in args.impls:
            entry = {}
            predicted = fl / best_rate[(impl, mode, dt)] if (impl, mode, dt) in best_rate else 0.0
            mem_limit = (args.mem_limit_gb * reporting.GiB if args.mem_limit_gb is not None
                         else 0.6 * machine.available_memory_bytes(device))
            est = (b * hq * t * t * BASELINE_MEM_BYTES_PER_SCORE[mode]) if impl == "eager" else 0
            if impl not in ("ours", "sdpa") and budget.expired():
                entry = {"status": "skipped", "why": f"--time-budget {args.time_budget:g} s spent"}
            elif impl != "ours" and est > mem_limit:
                entry = {"status": "OOM", "why": f"estimated {reporting.fmt_bytes(est)} for the "
                         f"score matrices > limit {reporting.fmt_bytes(mem_limit)}"}
            elif impl not in ("ours", "sdpa") and predicted > args.max_run_seconds:
                entry = {"status": "slow", "why": f"predicted {predicted:.0f} s per call from its "
                         f"rate on a smaller case > --max-run-seconds {args.max_run_seconds:g}"}
            else:
                try:
                    r = run_impl(impl, attn_ops, inputs, mode, causal, device, args)
                    entry = {"status": "ok", "median_ms": r["median_s"] * 1e3,
                             "min_ms": r["min_s"] * 1e3, "n": r["n"],
                             "gflops": fl / r["median_s"] / 1e9, "gqa": r["gqa"]}
                    key = (impl, mode, dt)
                    best_rate[key] = max(best_rate.get(key, 0.0), fl / r["median_s"])
                    if not args.no_check and impl in ("ours", "sdpa"):
                        compare[impl] = [x.detach().float() for x in r["compare"]]
                    del r
                except Exception as e:  # noqa: BLE001  (a baseline that rejects the case)
                    if impl == "ours" and not is_oom(e) and device != "cuda":
                        raise
                    entry = {"status": "OOM" if is_oom(e) else ("error" if impl == "ours" else "n/a"),
                             "why": runner.first_line(e)}
            if entry["status"] != "ok":
                print(f"  {label}: {impl} -> {entry['status']} ({entry['why']})", flush=True)
                notes.setdefault((impl, entry["status"], entry["why"]), []).append(label)
            row["impls"][impl] = entry
            machine.free_memory(device)
        if "ours" in compare and "sdpa" in compare:
            row["maxdiff_vs_sdpa"] = max(rel_maxdiff(a, s)
                                         for a, s in zip(compare["ours"], compare["sdpa"]))
        del inputs, compare
        machine.free_memory(device)
        results.append(row)
        print(format_row_line(row, args.impls), flush=True)
        report(final=False)

    report(final=True)
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
    mark = "*" if entry.get("gqa") == "repeat_kv" else ""
    return f"{entry['median_ms']:.{1 if device == 'cpu' else 3}f} ({reporting.fmt_num(entry['gflops'] / div)}){mark}"


def ratio(row, impl):
    a, o = row["impls"].get(impl), row["impls"].get("ours")
    if not a or not o or a["status"] != "ok" or o["status"] != "ok":
        return (a or {}).get("status", "-") if a else "-"
    return f"{a['median_ms'] / o['median_ms']:.2f}"


def format_row_line(row, impls):
    head = (f"{row['mode']:6s} {row['dtype']:8s} {'causal' if row['causal'] else 'full  '} "
            f"D={dims_label(row['D'], row['Dv'])} B={row['B']} T={row['T']} Hkv={row['Hkv']}: ")
    parts = []
    for impl in impls:
        e = row["impls"].get(impl)
        parts.append(f"{impl} {e['median_ms']:.3f} ms" if e and e["status"] == "ok"
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
    L += reporting.header_lines(info, ceilings, elapsed, device)
    L.append("")
    unit, div = rate_unit(device)
    both_masks = len(args.causal_modes) > 1
    L.append(f"Cells: median time in ms ({unit}). FLOPs: forward = 2·B·Hq·Tq·Tk·(Dqk + Dv) "
             f"(= 4·B·Hq·Tq·Tk·D), halved for causal; fwdbwd = 3.5 × forward (FlashAttention's "
             f"convention); every implementation is credited with the same count. X/ours = X time / "
             f"ours time (> 1: attn_ops is faster). "
             + ("" if both_masks else f"causal = {args.causal_modes[0]}. ") +
             f"Layouts: ours BSHD contiguous, the others [B, H, T, D] "
             f"contiguous. fwdbwd times forward + out.backward(grad). n = samples in ours' median "
             f"(max {args.repeats}, fewer when one call is long; see the script's docstring). "
             f"rel. diff vs sdpa: max abs(ours - sdpa) / max abs(sdpa), forward output (fwd) or the "
             f"largest over dq, dk, dv (fwdbwd).")
    if device == "cuda":
        L.append("")
        L.append("CUDA: times from CUDA events (device time of each call, median). sdpa = SDPA's "
                 "own backend choice with enable_gqa=True; sdpa[X] = SDPA restricted to backend X "
                 "(n/a: it rejects the case); a cell marked * repeats K/V to Hq heads inside the "
                 "timed call because the backend rejected enable_gqa=True. flex = "
                 "torch.compile(flex_attention), causal block mask, enable_gqa=True. ours % mm = "
                 "our rate / the dense matmul rate of the same dtype measured above.")
    L.append("")
    header = ["mode", "dtype"] + (["causal"] if both_masks else []) + \
        ["B", "T", "Hq", "Hkv", "D"] + impls + \
        [f"{i}/ours" for i in impls if i != "ours"] + \
        (["ours % mm"] if device == "cuda" else []) + ["n", "rel. diff vs sdpa"]
    rows = []
    for r in results:
        o = r["impls"].get("ours", {})
        pct = []
        if device == "cuda":
            mm = machine.matmul_gflops(ceilings, r["dtype"])
            pct = [f"{100 * o['gflops'] / mm:.0f}%" if mm and o.get("status") == "ok" else "-"]
        rows.append([r["mode"], r["dtype"]] + ([str(r["causal"])] if both_masks else []) +
                    [r["B"], r["T"], r["Hq"], r["Hkv"], dims_label(r["D"], r["Dv"])] +
                    [cell(r["impls"].get(i), device) for i in impls] +
                    [ratio(r, i) for i in impls if i != "ours"] + pct +
                    [o.get("n", "-"),
                     f"{r['maxdiff_vs_sdpa']:.1e}" if "maxdiff_vs_sdpa" in r else "-"])
    L.append(reporting.markdown_table(header, [[str(c) for c in row] for row in rows]))
    L += reporting.skipped_lines(notes)
    return "\n".join(L)


if __name__ == "__main__":
    sys.exit(main())
