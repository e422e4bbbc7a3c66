"""MLA absorbed decode on the CPU as CPU time of one thread: attn_ops.mla_decode against DeepSeek-V3's
absorbed einsum (bench_mla.py's "torch"), on a machine too busy for wall-clock figures.

With other processes on the cores, a call's wall time measures the queue; the process's CPU time with one
thread measures the cycles the kernel itself took (memory stalls included), so two builds compared with
it, one after the other, still rank. Per case: median of --repeats calls, best of --rounds rounds.

  python benchmarks/experiments/mla_cpu_time.py                       # the four cases below
  python benchmarks/experiments/mla_cpu_time.py bfloat16_h16 float32_h16
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import machine  # noqa: E402
import timing  # noqa: E402

attn_ops = machine.import_attn_ops()

CASES = {  # name: (batch, context, heads, dtype)
    "float32_h16": (16, 4096, 16, torch.float32),
    "bfloat16_h16": (16, 4096, 16, torch.bfloat16),
    "float32_h128": (4, 4096, 128, torch.float32),
    "bfloat16_h128": (4, 4096, 128, torch.bfloat16),
}


def absorbed_einsum(q_latent, q_rope, kv_cache, pe_cache, scale):
    scores = (torch.einsum("bshc,btc->bsht", q_latent, kv_cache) +
              torch.einsum("bshr,btr->bsht", q_rope, pe_cache)) * scale
    scores = scores.softmax(dim=-1, dtype=torch.float32).type_as(q_latent)
    return torch.einsum("bsht,btc->bshc", scores, kv_cache)


def cpu_time(fn, repeats):
    samples = sorted(timing.cpu_time_samples(fn, repeats))
    return samples[len(samples) // 2]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cases", nargs="*", help=f"subset of {list(CASES)} (default: all)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        p.error(f"unknown cases {unknown}, expected some of {list(CASES)}")
    torch.set_num_threads(1)
    for name in args.cases or list(CASES):
        b, t, h, dtype = CASES[name]
        torch.manual_seed(0)
        cache = torch.randn(b, t, 576, dtype=dtype)
        q_latent, q_rope = torch.randn(b, 1, h, 512, dtype=dtype), torch.randn(b, 1, h, 64, dtype=dtype)
        lens = torch.full((b,), t, dtype=torch.int32)
        scale = 192 ** -0.5
        kv, pe = cache[..., :512].contiguous(), cache[..., 512:].contiguous()
        ours = min(cpu_time(lambda: attn_ops.mla_decode(q_latent, q_rope, cache, lens, scale=scale), args.repeats)
                   for _ in range(args.rounds))
        ref = min(cpu_time(lambda: absorbed_einsum(q_latent, q_rope, kv, pe, scale), args.repeats)
                  for _ in range(args.rounds))
        gbs = cache.numel() * cache.element_size() / ours / 1e9
        gflops = 2 * b * h * t * (2 * 512 + 64) / ours / 1e9
        print(f"{name} B={b} ctx={t} H={h}: ours {ours * 1e3:.2f} ms CPU ({gbs:.1f} GB/s, {gflops:.0f} GFLOP/s), "
              f"einsum {ref * 1e3:.2f} ms CPU, einsum/ours {ref / ours:.2f}", flush=True)


if __name__ == "__main__":
    main()
