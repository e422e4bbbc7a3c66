"""Peak memory of one attention forward+backward beyond its inputs, ours or SDPA, in this process.

Run once per implementation, each in its own process:
  python benchmarks/bench_peak_memory.py ours  --seqlen 8192
  python benchmarks/bench_peak_memory.py sdpa  --seqlen 8192
Shapes: B=1, Hq=32, Hkv=8 (GQA), D=128, float32 (--dtype bfloat16: the low-precision backward), causal. Each
implementation gets its inputs and output gradient created directly in its own layout (SDPA: [B, H, T, D]; no
transposed copy whose freed pages would raise the high-water mark before the run), is warmed up on a small case
(code pages, OpenMP and BLAS buffers), and then reports the resident-set growth at the peak of one forward+backward
(peak_rss.peak_extra_bytes: the high-water mark reset right before the run).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import machine  # noqa: E402
from peak_rss import peak_extra_bytes  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("impl", choices=["ours", "sdpa"])
    p.add_argument("--seqlen", type=int, default=8192)
    p.add_argument("--hq", type=int, default=32)
    p.add_argument("--hkv", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    args = p.parse_args(argv)
    attn_ops = machine.import_attn_ops()  # both processes load the same libraries

    def make_run(seqlen):
        """Inputs (touched) and a forward+backward closure over them, in the implementation's layout."""
        if args.impl == "ours":  # BSHD
            shape_q, shape_kv = (1, seqlen, args.hq, args.head_dim), (1, seqlen, args.hkv, args.head_dim)
        else:  # SDPA takes [B, H, T, D]
            shape_q, shape_kv = (1, args.hq, seqlen, args.head_dim), (1, args.hkv, seqlen, args.head_dim)
        dtype = getattr(torch, args.dtype)
        q, k, v = (torch.randn(s, dtype=dtype).requires_grad_() for s in (shape_q, shape_kv, shape_kv))
        dout = torch.randn(shape_q, dtype=dtype)
        if args.impl == "ours":
            return lambda: attn_ops.attention(q, k, v, causal=True)[0].backward(dout)
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).backward(dout)

    make_run(256)()  # warm-up
    extra = peak_extra_bytes(make_run(args.seqlen))
    print(f"{args.impl}: T={args.seqlen} Hq={args.hq} Hkv={args.hkv} D={args.head_dim} {args.dtype} causal "
          f"forward+backward: peak memory beyond inputs {extra / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
