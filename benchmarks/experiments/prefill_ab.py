"""Interleaved A/B timing of the CPU prefill forward: attn_ops.attention against SDPA, call by call.

On a shared machine whose speed moves between runs, bench_attention.py (all of one implementation's
samples, then the other's) can credit a load change to one side. Here every round calls each variant once,
in turn, and the medians over rounds are compared. A variant is "ours" under environment settings
(e.g. ATTN_OPS_CPU_AVX512BF16=0 or ATTN_OPS_CPU_ISA=avx2), set around its calls only.

  python benchmarks/experiments/prefill_ab.py --seqlen 2048 --rounds 9 ours ours:ATTN_OPS_CPU_AVX512BF16=0
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from machine import import_attn_ops  # noqa: E402

attn_ops = import_attn_ops()


def variant(spec, q, k, v, causal):
    """spec = "ours" or "ours:VAR=value,VAR=value": a call of attn_ops.attention under those settings."""
    settings = dict(kv.split("=", 1) for kv in spec.partition(":")[2].split(",") if kv)

    def call():
        saved = {name: os.environ.get(name) for name in settings}
        os.environ.update(settings)
        try:
            return attn_ops.attention(q, k, v, causal=causal)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name)
                else:
                    os.environ[name] = value
    return call


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variants", nargs="*", default=["ours"])
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--hq", type=int, default=32)
    parser.add_argument("--hkv", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", action="append", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--no-causal", action="store_true")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    causal = not args.no_causal
    for name in args.dtype or ["float32", "bfloat16"]:
        dtype = getattr(torch, name)
        torch.manual_seed(0)
        b, t, d = args.batch, args.seqlen, args.head_dim
        q = torch.randn(b, t, args.hq, d, dtype=dtype)
        k, v = (torch.randn(b, t, args.hkv, d, dtype=dtype) for _ in range(2))
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        calls = {"sdpa": lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=True)}
        calls.update({spec: variant(spec, q, k, v, causal) for spec in args.variants})
        times = {spec: [] for spec in calls}
        with torch.no_grad():
            for call in calls.values():  # warm-up
                call()
            for _ in range(args.rounds):
                for spec, call in calls.items():
                    start = time.perf_counter()
                    call()
                    times[spec].append(time.perf_counter() - start)
        med = {spec: statistics.median(x) * 1e3 for spec, x in times.items()}
        cells = "  ".join(f"{spec} {m:.1f} ms (sdpa/it {med['sdpa'] / m:.2f})" for spec, m in med.items())
        print(f"{name} B={b} T={t} Hq={args.hq} Hkv={args.hkv} D={d} causal={causal} rounds={args.rounds}: {cells}",
              flush=True)


if __name__ == "__main__":
    main()
