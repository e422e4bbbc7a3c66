"""The CPU decode kernel over a KV cache in 4 KiB pages against the same cache in transparent huge pages
(2 MiB, what the attn_ops.nn cache modules allocate on Linux: attn_ops/_huge_pages.py), in turn, in one
process: GQA 32/8, D = 128, one query token per row, every row attending to its whole context.

The kernel reads one KV head's rows, kilobytes apart in the [batch, seqlen, heads, head_dim] layout, so with
4 KiB pages nearly every other row is a new page and a TLB miss; huge pages remove most of them.

  python benchmarks/experiments/decode_huge_pages.py --dtype bfloat16 float32 --batch 32 --context 4096 --rounds 7
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import machine  # noqa: E402
from cli import add_decode_sweep_args  # noqa: E402
from reporting import print_table_report  # noqa: E402
from timing import medians_in_turn  # noqa: E402

attn_ops = machine.import_attn_ops()
from attn_ops import _huge_pages  # noqa: E402

HQ, HKV, D = 32, 8, 128


def anon_huge_mib() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def run(dtype: torch.dtype, batch: int, context: int, rounds: int) -> list[str]:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, 1, HQ, D, generator=g).to(dtype)
    lens = torch.full((batch,), context, dtype=torch.int32)
    caches = {}
    for name, zeros in (("4 KiB pages", torch.zeros), ("huge pages", _huge_pages.zeros)):
        before = anon_huge_mib()
        caches[name] = [zeros(batch, context, HKV, D, dtype=dtype, device="cpu") for _ in range(2)]
        for t in caches[name]:
            t.normal_(generator=g)
        caches[name].append(anon_huge_mib() - before)
    medians = medians_in_turn({name: lambda k=k, v=v: attn_ops.attention_with_kvcache(q, k, v, lens)
                               for name, (k, v, _) in caches.items()}, rounds)
    nbytes = 2 * batch * context * HKV * D * dtype.itemsize
    plain = medians["4 KiB pages"]
    rows = []
    for name, median in medians.items():
        rows.append([str(dtype).replace("torch.", ""), str(batch), str(context), name,
                     f"{caches[name][2]:.0f}", f"{median * 1e3:.1f}", f"{nbytes / median / 1e9:.1f}",
                     f"{plain / median:.2f}"])
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_decode_sweep_args(p, rounds=7)
    p.add_argument("--out", help="write the markdown report here too")
    args = p.parse_args()
    info = machine.machine_info("cpu")
    rows = []
    for name in args.dtype:
        rows += run(getattr(torch, name), args.batch, args.context, args.rounds)
    print_table_report("Decode over 4 KiB pages and transparent huge pages", info,
                       f"Hq = {HQ}, Hkv = {HKV}, D = {D}. Median of {args.rounds} calls in turn. huge MiB = the "
                       "cache's AnonHugePages (/proc/meminfo) after it was written; speed-up = the 4 KiB time / this "
                       "time.",
                       ["dtype", "B", "context", "cache", "huge MiB", "ms", "GB/s", "speed-up"], rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
