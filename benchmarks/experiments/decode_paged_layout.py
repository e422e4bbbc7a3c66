"""The CPU decode kernel over a paged KV cache in two block layouts holding the same values, in turn, in one
process: token-major blocks [num_blocks, block_size, Hkv, D] (vLLM's layout) against head-major blocks
[num_blocks, Hkv, block_size, D] passed as their .transpose(1, 2) view (attn_ops.nn.PagedKVCache's CPU layout).
GQA 32/8, D = 128, one query token per row, every row attending to its whole context; blocks in shuffled order.

In head-major blocks each KV head's rows of a block are contiguous, and the kernel takes one KV head per work
item (decode_heads_per_item in csrc/attention/cpu/decode_cpu.cpp); in token-major ones it takes all heads.

  python benchmarks/experiments/decode_paged_layout.py --dtype bfloat16 float32 --block-size 4 16 64 256 --rounds 7
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

HQ, HKV, D = 32, 8, 128


def run(dtype: torch.dtype, batch: int, context: int, block: int, rounds: int) -> list[str]:
    g = torch.Generator().manual_seed(0)
    blocks_per_row = context // block
    num_blocks = batch * blocks_per_row
    table = torch.randperm(num_blocks, generator=g).view(batch, blocks_per_row).to(torch.int32)
    q = torch.randn(batch, 1, HQ, D, generator=g).to(dtype)
    lens = torch.full((batch,), context, dtype=torch.int32)
    token_major = [torch.randn(num_blocks, block, HKV, D, generator=g).to(dtype) for _ in range(2)]
    head_major = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in token_major]  # same values
    pools = {"token-major blocks": token_major, "head-major blocks": head_major}
    medians = medians_in_turn({name: lambda k=k, v=v: attn_ops.attention_with_kvcache(q, k, v, lens, block_table=table)
                               for name, (k, v) in pools.items()}, rounds)
    nbytes = 2 * batch * context * HKV * D * dtype.itemsize
    base = medians["token-major blocks"]
    rows = []
    for name, median in medians.items():
        rows.append([str(dtype).replace("torch.", ""), str(batch), str(context), str(block), name,
                     f"{median * 1e3:.1f}", f"{nbytes / median / 1e9:.1f}", f"{base / median:.2f}"])
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_decode_sweep_args(p, rounds=7)
    p.add_argument("--block-size", type=int, nargs="+", default=[4, 16, 64, 256])
    p.add_argument("--out", help="write the markdown report here too")
    args = p.parse_args()
    for bs in args.block_size:
        if bs < 1 or args.context % bs:
            p.error(f"--context must be a multiple of every --block-size (got {bs})")
    info = machine.machine_info("cpu")
    rows = []
    for name in args.dtype:
        for bs in args.block_size:
            rows += run(getattr(torch, name), args.batch, args.context, bs, args.rounds)
    print_table_report("Decode over paged caches: token-major and head-major blocks", info,
                       f"Hq = {HQ}, Hkv = {HKV}, D = {D}, blocks in shuffled order, 4 KiB pages. Median of "
                       f"{args.rounds} calls in turn. speed-up = the token-major time / this time.",
                       ["dtype", "B", "context", "block", "pool", "ms", "GB/s", "speed-up"], rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
