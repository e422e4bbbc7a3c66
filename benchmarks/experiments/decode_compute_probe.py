"""The CPU decode kernel's compute rate apart from memory: one thread, CPU time (robust on a shared machine),
GQA 32/8, D = 128, B = 32, context 4096, three caches read by the same kernel:
  L1      a contiguous cache whose key rows all alias one row per (sequence, head) (seq stride 0): every load
          hits L1, so the time is the kernel's instructions alone
  L2      a paged cache (block 64) whose block table points at the same 4 blocks over and over (1 MiB bf16)
  stream  the same paged cache with every block distinct (0.5 GiB bf16, read from memory)
If L1 / L2 are not much faster than stream, the kernel is compute-bound.

  python benchmarks/experiments/decode_compute_probe.py --dtype bfloat16 --repeats 5
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import machine  # noqa: E402
import timing  # noqa: E402

attn_ops = machine.import_attn_ops()

B, T, HQ, HKV, D, BS = 32, 4096, 32, 8, 128, 64


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    dt = getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, 1, HQ, D, generator=g).to(dt)
    lens = torch.full((B,), T, dtype=torch.int32)
    one_row = [torch.randn(B, 1, HKV, D, generator=g).to(dt).expand(B, T, HKV, D) for _ in range(2)]
    blocks = B * T // BS
    paged = [torch.randn(blocks, BS, HKV, D, generator=g).to(dt) for _ in range(2)]
    cases = {
        "L1": (one_row, None),
        "L2": (paged, (torch.arange(blocks) % 4).to(torch.int32).reshape(B, -1)),
        "stream": (paged, torch.randperm(blocks, generator=g).to(torch.int32).reshape(B, -1)),
    }
    nbytes = 2 * B * T * HKV * D * dt.itemsize
    print(f"attn_ops {attn_ops.__file__}, {args.dtype}, 1 thread, best CPU time of {args.repeats}")
    for name, ((k, v), table) in cases.items():
        t = min(timing.cpu_time_samples(lambda: attn_ops.attention_with_kvcache(q, k, v, lens, block_table=table),
                                          args.repeats))
        print(f"{name:6s} {t * 1e3:7.1f} ms  {nbytes / t / 1e9:5.1f} GB/s of cache  "
              f"{t / (B * T * HKV) * 1e9:5.1f} ns per key and KV head")


if __name__ == "__main__":
    main()
