"""Fused additive attention (attn_ops.additive_attention) against the plain formulation that
materializes tanh(W_q q_i + W_k k_j) as a [B, Tq, Tk, A] tensor:

    scores = torch.tanh(qp[:, :, None, :] + kp[:, None, :, :]) @ w     # [B, Tq, Tk]
    out = torch.softmax(scores, dim=-1) @ v

Forward (fwd) and forward + backward (fwdbwd, out.backward(grad)), float32, default shape B = 8,
Tq = Tk = 1024, A = 256, Dv = 256. Time: median of --repeats calls (benchmarks/lib/timing.py, measure). Peak
memory: the resident-set growth at the call's peak, inputs excluded, measured once in a fresh child
process (benchmarks/lib/peak_rss.py).

The materializing formulation needs about 2·B·Tq·Tk·A·4 bytes forward and 3× that with the backward
(16 GiB and 24 GiB at the default shape). When that does not fit in half of the available memory, it is
run at the largest batch that fits, ours is measured at that batch too (a same-shape ratio), and its
default-batch figures are extrapolated linearly in B (marked "extrapolated").
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import machine  # noqa: E402
import reporting  # noqa: E402
import timing  # noqa: E402
import peak_rss  # noqa: E402

attn_ops = machine.import_attn_ops()


def inputs(B, T, A, Dv, requires_grad, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *s: torch.randn(*s, generator=g).requires_grad_(requires_grad)  # noqa: E731
    return make(B, T, A), make(B, T, A), make(A), make(B, T, Dv)


def materialized(qp, kp, w, v):
    scores = torch.tanh(qp[:, :, None, :] + kp[:, None, :, :]) @ w
    return torch.softmax(scores, dim=-1) @ v


def fused(qp, kp, w, v):
    return attn_ops.additive_attention(qp, kp, w, v)[0]


IMPLS = {"ours": fused, "materialized": materialized}


def make_call(impl, mode, B, T, A, Dv):
    args = inputs(B, T, A, Dv, requires_grad=mode == "fwdbwd")
    grad = torch.randn(B, T, Dv)
    fn = IMPLS[impl]
    if mode == "fwd":
        def call():
            with torch.no_grad():
                return fn(*args)
    else:
        def call():
            for t in args:
                t.grad = None
            fn(*args).backward(grad)
    return call


def child(argv):
    impl, mode, B, T, A, Dv = argv[0], argv[1], *map(int, argv[2:6])
    make_call(impl, mode, 1, 8, 8, 8)()  # thread pools and first-call allocations, before the reset
    call = make_call(impl, mode, B, T, A, Dv)
    print(json.dumps({"peak_bytes": peak_rss.peak_extra_bytes(call)}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--len", type=int, default=1024, help="Tq = Tk")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--value-dim", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out")
    p.add_argument("--json")
    args = p.parse_args()
    B, T, A, Dv = args.batch, args.len, args.hidden, args.value_dim
    info = machine.machine_info("cpu")
    start = time.perf_counter()
    rows, payload = [], {"info": info, "cases": []}
    script = os.path.abspath(__file__)
    for mode in ("fwd", "fwdbwd"):
        need = (2 if mode == "fwd" else 3) * T * T * A * 4  # per batch entry, materialized
        fit = max(1, min(B, int(0.5 * machine.available_memory_bytes("cpu") // need)))
        fit = 1 << (fit.bit_length() - 1) if fit < B else B  # a power of two below B, or B itself
        batches = {("ours", B)} | {("materialized", fit), ("ours", fit)}
        results = {}
        for impl, b in sorted(batches, key=lambda x: (x[1] != B, x[0])):
            t = timing.measure(make_call(impl, mode, b, T, A, Dv), device="cpu", repeats=args.repeats,
                               warmup=1, budget_s=60)
            mem = peak_rss.measure_in_child(script, [impl, mode, str(b), str(T), str(A), str(Dv)])
            results[(impl, b)] = (t["median_s"], mem.get("peak_bytes"), t["n"])
            payload["cases"].append({"mode": mode, "impl": impl, "B": b, "T": T, "A": A, "Dv": Dv,
                                     "median_s": t["median_s"], "samples": t["samples"], **mem})
            print(mode, impl, b, f"{t['median_s'] * 1e3:.1f} ms", mem, flush=True)
        ours_t, ours_m, _ = results[("ours", fit)]
        mat_t, mat_m, _ = results[("materialized", fit)]
        for (impl, b), (sec, mem, n) in sorted(results.items(), key=lambda x: (x[0][1] != B, x[0][0])):
            rows.append([mode, impl, str(b), reporting.fmt_time(sec), reporting.fmt_bytes(mem) if mem else "error",
                         str(n),
                         "" if impl == "ours" else f"{mat_t / ours_t:.1f}x",
                         "" if impl == "ours" else f"{mat_m / max(ours_m, 1):.0f}x"])
        if fit < B:
            scale = B / fit
            big_t, big_m, _ = results[("ours", B)]
            rows.append([mode, "materialized (extrapolated x%g)" % scale, str(B), reporting.fmt_time(mat_t * scale),
                         reporting.fmt_bytes(mat_m * scale), "-", f"{mat_t * scale / big_t:.1f}x",
                         f"{mat_m * scale / max(big_m, 1):.0f}x"])
    elapsed = time.perf_counter() - start
    md = ["# Fused additive attention vs the materializing formulation (CPU)", "",
          f"- machine: {info['cpu']}, {info['usable_cores']} usable cores, torch.get_num_threads() = "
          f"{info['torch_threads']}, {info['memory_total_gib']} GiB RAM; shared with other jobs while it ran "
          f"(load average at start {', '.join(f'{x:.2f}' for x in info['loadavg_at_start'])}): absolute times "
          f"are noisy, the ratios within this run are the result",
          f"- torch {info['torch']}, git {info['git_commit']}, {info['date']}, run took {elapsed / 60:.1f} min",
          f"- command: `{info['command']}`",
          f"- shape: Tq = Tk = {T}, A = {A}, Dv = {Dv}, float32; B as listed",
          "", "time: median of n calls; peak: resident-set growth at the call's peak in a fresh process, "
          "inputs excluded; x ours: materialized / ours at the same B.", "",
          reporting.markdown_table(["mode", "impl", "B", "time", "peak memory", "n", "time x ours",
                                 "memory x ours"], rows)]
    text = "\n".join(md)
    print(text)
    reporting.write_outputs(args, text, payload)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
    else:
        main()
