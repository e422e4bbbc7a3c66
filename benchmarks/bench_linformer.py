"""Linformer attention against full attention as the sequence grows: time and peak memory.

Both run on q, k, v [1, T, H, D] (float32, H = 4 heads, D = 64): full attention is attn_ops.attention
over the T keys; Linformer projects keys and values along the sequence to proj_len rows
(K' = E[:, :T] K, V' = F[:, :T] V, as attn_ops.nn.LinformerSelfAttention does) and runs the same
op over them. The Q/K/V/output projections are the same for both and are left out.

Predicted speed-up from the FLOP counts: full 4·T²·H·D; Linformer 4·T·P·H·D (attention) +
4·P·T·Hkv·D (the two projections), so full / Linformer = T / (P · (1 + Hkv / H)).

Time: --repeats interleaved rounds (full, then Linformer), minimum per implementation; speed-up: median
over rounds of the per-round ratio. Peak memory: resident-set growth at the
call's peak, inputs excluded, in a fresh child process (benchmarks/lib/peak_rss.py). Writes a markdown
table and a PNG plot (matplotlib).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import machine  # noqa: E402
import reporting  # noqa: E402
import peak_rss  # noqa: E402

attn_ops = machine.import_attn_ops()
H, D = 4, 64


def make_call(impl, T, P):
    g = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(1, T, H, D, generator=g) for _ in range(3))
    if impl == "full":
        return lambda: attn_ops.attention(q, k, v)[0]
    e, f = (torch.randn(P, T, generator=g) / T ** 0.5 for _ in range(2))

    def linformer():
        kp = torch.einsum("pt,bthd->bphd", e, k)
        vp = torch.einsum("pt,bthd->bphd", f, v)
        return attn_ops.attention(q, kp, vp)[0]
    return linformer


def child(argv):
    impl, T, P = argv[0], int(argv[1]), int(argv[2])
    make_call(impl, 64, 8)()  # thread pools and first-call allocations, before the reset
    call = make_call(impl, T, P)
    print(json.dumps({"peak_bytes": peak_rss.peak_extra_bytes(call)}))


def plot(rows, P, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    Ts = [r["T"] for r in rows if r["impl"] == "full"]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 4))
    for impl, marker in (("full", "o"), ("linformer", "s")):
        sel = [r for r in rows if r["impl"] == impl]
        ax_t.plot(Ts, [r["min_s"] * 1e3 for r in sel], marker=marker, label=impl)
        ax_m.plot(Ts, [r["peak_bytes"] / 2**20 for r in sel], marker=marker, label=impl)
    for ax, label in ((ax_t, "time (ms)"), (ax_m, "peak memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(f"Linformer (proj_len {P}) vs full attention, CPU float32, H={H}, D={D}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="1024,2048,4096,8192,16384,32768")
    p.add_argument("--proj-len", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out")
    p.add_argument("--json")
    p.add_argument("--plot")
    args = p.parse_args()
    P = args.proj_len
    info = machine.machine_info("cpu")
    start = time.perf_counter()
    script = os.path.abspath(__file__)
    results, table = [], []
    for T in map(int, args.lengths.split(",")):
        calls = {impl: make_call(impl, T, P) for impl in ("full", "linformer")}
        for call in calls.values():  # warm-up
            call()
        samples = {impl: [] for impl in calls}
        for _ in range(args.repeats):  # interleaved rounds: both see the same load from other jobs
            for impl, call in calls.items():
                t0 = time.perf_counter()
                call()
                samples[impl].append(time.perf_counter() - t0)
        row = {}
        for impl in calls:
            mem = peak_rss.measure_in_child(script, [impl, str(T), str(P)])
            row[impl] = {"impl": impl, "T": T, "min_s": min(samples[impl]), "samples": samples[impl], **mem}
            results.append(row[impl])
            print(T, impl, [f"{x * 1e3:.1f} ms" for x in samples[impl]], mem, flush=True)
        full, lin = row["full"], row["linformer"]
        predicted = T / (P * 2)  # Hkv = H
        measured = statistics.median(f / l for f, l in zip(full["samples"], lin["samples"]))
        table.append([str(T), reporting.fmt_time(full["min_s"]), reporting.fmt_time(lin["min_s"]),
                      f"{measured:.1f}x", f"{predicted:.1f}x", f"{measured / predicted:.2f}",
                      reporting.fmt_bytes(full["peak_bytes"]), reporting.fmt_bytes(lin["peak_bytes"])])
    elapsed = time.perf_counter() - start
    md = [f"# Linformer (proj_len {P}) vs full attention (CPU)", "",
          f"- machine: {info['cpu']}, {info['usable_cores']} usable cores, torch.get_num_threads() = "
          f"{info['torch_threads']}, {info['memory_total_gib']} GiB RAM; shared with other jobs while it ran "
          f"(load average at start {', '.join(f'{x:.2f}' for x in info['loadavg_at_start'])}): absolute times "
          f"are noisy, the ratios within this run are the result",
          f"- torch {info['torch']}, git {info['git_commit']}, {info['date']}, run took {elapsed / 60:.1f} min",
          f"- command: `{info['command']}`",
          f"- q, k, v [1, T, {H}, {D}] float32; full = attn_ops.attention over T keys; Linformer = "
          f"E[:, :T] K, F[:, :T] V ([{P}, T] each) then attn_ops.attention over {P} keys",
          "", "Timing: one warm-up call each, then --repeats rounds, each timing full then Linformer back to back "
          "(so both see the same load from the other jobs on this shared machine); the times are the minimum "
          "over rounds, the speed-up is the median over rounds of full / Linformer. "
          "predicted = T / (2 proj_len), from the FLOP counts (see the script's docstring); "
          "measured / predicted = 1 means the complexity model holds. Peak memory: resident-set growth at "
          "the call's peak in a fresh process, inputs excluded (attn_ops.attention streams keys, so full "
          "attention's memory is linear in T here too; a materializing implementation would need "
          "4·H·T² bytes for the scores).", "",
          reporting.markdown_table(["T", "full", "linformer", "speed-up", "predicted", "measured / predicted",
                                 "full peak", "linformer peak"], table)]
    if args.plot:
        plot(results, P, args.plot)
        md += ["", f"![time and memory]({os.path.basename(args.plot)})"]
    text = "\n".join(md)
    print(text)
    reporting.write_outputs(args, text, {"info": info, "cases": results})


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
    else:
        main()
