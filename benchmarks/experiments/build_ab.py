"""Two builds of attn_ops compared on the CPU decode (GQA and MLA) and prefill (forward, forward+backward), in
turn: each round runs every build once, in a fresh process, over the same cases, and reports per case the
median over rounds of each build's median call time, with the copy bandwidth each process measured next to its
calls.

A kernel change's effect (a few tens of percent) is smaller than how much this shared machine's speed moves
between runs, so the builds take turns instead of running one after the other. A build is a folder that
holds an `attn_ops` package with its compiled library (a copy of the repository's `attn_ops/` after a build).

  cp -r attn_ops /tmp/ab/old/            # before the change (built)
  python benchmarks/experiments/build_ab.py old=/tmp/ab/old new=. --dtype bfloat16 float32 \\
      --layout bshd paged16 bhtd paged16hm --rounds 5

Layouts (GQA --hq / 8, D=128, every row at the full context; MLA: --hq heads, kv_lora_rank 512 + rope 64):
  bshd      a contiguous [B, T, Hkv, D] cache (the op's own layout, a tensor of the user's)
  bhtd      a [B, Hkv, T, D] cache passed as its .transpose(1, 2) view (HF's layout; KVCache's on the CPU)
  paged16   [num_blocks, 16, Hkv, D] blocks under a shuffled block table
  paged16hm [num_blocks, Hkv, 16, D] blocks passed as .transpose(1, 2) views (PagedKVCache's on the CPU)
  mla       attn_ops.mla_decode over a contiguous [B, T, 576] latent cache
  prefill   causal attn_ops.attention forward of [B, T, Hq, D] over [B, T, 8, D] (T = --context)
  fwdbwd    the same forward and its backward (out.sum() backward)

  python benchmarks/experiments/build_ab.py old=/tmp/ab/old new=. --layout mla --hq 16 --batch 16
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from cli import add_decode_sweep_args  # noqa: E402
from timing import medians_in_turn  # noqa: E402

LAYOUTS = ("bshd", "bhtd", "paged16", "paged16hm", "mla", "prefill", "fwdbwd")
HKV, D, BLOCK = 8, 128, 16
MLA_RANK, MLA_ROPE = 512, 64


def cache(layout, dtype, batch, context):
    """(k, v, block_table) of a layout, filled with values in [-1, 1)."""
    import torch

    def filled(*shape):
        return torch.empty(*shape, dtype=dtype).uniform_(-1, 1)

    if layout == "bshd":
        return filled(batch, context, HKV, D), filled(batch, context, HKV, D), None
    if layout == "bhtd":
        return filled(batch, HKV, context, D).transpose(1, 2), filled(batch, HKV, context, D).transpose(1, 2), None
    blocks = batch * context // BLOCK
    table = torch.randperm(blocks).to(torch.int32).reshape(batch, -1)
    if layout == "paged16":
        return filled(blocks, BLOCK, HKV, D), filled(blocks, BLOCK, HKV, D), table
    return filled(blocks, HKV, BLOCK, D).transpose(1, 2), filled(blocks, HKV, BLOCK, D).transpose(1, 2), table


def time_case(attn_ops, case, repeats):
    """The median call time of one case "dtype:layout:batch:context:hq", with the copy bandwidth measured in turn."""
    import torch

    dtype_name, layout, batch, context, hq = case.split(":")
    dtype, batch, context, hq = getattr(torch, dtype_name), int(batch), int(context), int(hq)
    lens = torch.full((batch,), context, dtype=torch.int32)
    if layout in ("prefill", "fwdbwd"):
        grad = layout == "fwdbwd"
        q = torch.empty(batch, context, hq, D, dtype=dtype).uniform_(-1, 1).requires_grad_(grad)
        k, v = (torch.empty(batch, context, HKV, D, dtype=dtype).uniform_(-1, 1).requires_grad_(grad) for _ in "kv")
        nbytes = 0  # compute-bound: no bandwidth column
        if grad:
            ours = lambda: attn_ops.attention(q, k, v, causal=True)[0].sum().backward()
        else:
            ours = lambda: attn_ops.attention(q, k, v, causal=True)
    elif layout == "mla":
        latent = torch.empty(batch, context, MLA_RANK + MLA_ROPE, dtype=dtype).uniform_(-1, 1)
        q_latent = torch.empty(batch, 1, hq, MLA_RANK, dtype=dtype).uniform_(-1, 1)
        q_rope = torch.empty(batch, 1, hq, MLA_ROPE, dtype=dtype).uniform_(-1, 1)
        nbytes = latent.numel() * dtype.itemsize
        # DeepSeek-V3's softmax scale (its q/k head dim is 192)
        ours = lambda: attn_ops.mla_decode(q_latent, q_rope, latent, lens, scale=192 ** -0.5)
    else:
        k, v, table = cache(layout, dtype, batch, context)
        q = torch.empty(batch, 1, hq, D, dtype=dtype).uniform_(-1, 1)
        nbytes = 2 * batch * context * HKV * D * dtype.itemsize
        ours = lambda: attn_ops.attention_with_kvcache(q, k, v, lens, block_table=table)
    src = torch.empty(max(nbytes, 1 << 26) // 4).uniform_()
    dst = torch.empty_like(src)
    calls = {"ours": ours, "copy": lambda: dst.copy_(src)}
    for call in calls.values():
        call()  # warm-up
    medians = medians_in_turn(calls, repeats)
    ours, copy = medians["ours"], medians["copy"]
    return {"ours_s": ours, "gbs": nbytes / ours / 1e9, "copy_gbs": 2 * src.numel() * 4 / copy / 1e9}


def worker(args):
    """One build's round: per case the median call time and the copy bandwidth, as one json line."""
    sys.path.insert(0, os.path.abspath(args.worker))
    import torch

    import attn_ops

    torch.manual_seed(args.seed)
    results = {case: time_case(attn_ops, case, args.repeats) for case in args.cases}
    print(json.dumps({"attn_ops": attn_ops.__file__, "results": results}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("builds", nargs="*", help="name=folder holding a built attn_ops package (two or more)")
    add_decode_sweep_args(p, rounds=5)
    p.add_argument("--layout", nargs="+", default=["bshd"], choices=LAYOUTS)
    p.add_argument("--hq", type=int, default=32, help="query heads (GQA: over 8 KV heads; MLA: the heads)")
    p.add_argument("--repeats", type=int, default=7, help="calls per case and process")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--cases", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    builds = dict(b.split("=", 1) for b in args.builds)
    if len(builds) < 2:
        p.error("name two or more builds as name=folder")
    cases = [f"{d}:{layout}:{args.batch}:{args.context}:{args.hq}" for d in args.dtype for layout in args.layout]
    runs = {name: [] for name in builds}
    for _ in range(args.rounds):
        for name, folder in builds.items():
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", os.path.abspath(folder),
                   "--repeats", str(args.repeats), "--seed", str(args.seed), "--cases", *cases]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd="/").stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
    first = next(iter(builds))
    print(f"command: python benchmarks/experiments/build_ab.py {' '.join(args.builds)} --dtype {' '.join(args.dtype)} "
          f"--layout {' '.join(args.layout)} --batch {args.batch} --context {args.context} --hq {args.hq} "
          f"--rounds {args.rounds} "
          f"--repeats {args.repeats}")
    for name in builds:
        print(f"{name}: {runs[name][0]['attn_ops']}")
    print(f"\nGQA {args.hq}/{HKV}, D={D} (MLA: {args.hq} heads, {MLA_RANK} + {MLA_ROPE}), B={args.batch}, context "
          f"{args.context}. Cells: median over {args.rounds} rounds "
          f"of the call's median time, GB/s of cache read, % of the copy bandwidth its process measured "
          f"(bytes read + written); ratio: {first}'s time / the build's.\n")
    names = list(builds)
    print("| dtype | layout | " + " | ".join(names) + " | " + " | ".join(f"{first}/{n}" for n in names[1:]) + " |")
    print("|---|---|" + "---|" * (2 * len(names) - 1))
    for case in cases:
        dtype_name, layout = case.split(":")[:2]
        cells, times = [], {}
        for name in names:
            rs = [r["results"][case] for r in runs[name]]
            times[name] = statistics.median(r["ours_s"] for r in rs)
            gbs = statistics.median(r["gbs"] for r in rs)
            pct = statistics.median(r["gbs"] / r["copy_gbs"] for r in rs)
            cells.append(f"{times[name] * 1e3:.1f} ms" + (f", {gbs:.1f} GB/s, {pct:.0%}" if gbs else ""))
        ratios = [f"{times[first] / times[n]:.2f}" for n in names[1:]]
        print(f"| {dtype_name} | {layout} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")


if __name__ == "__main__":
    main()
