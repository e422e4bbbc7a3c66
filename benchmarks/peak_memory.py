"""Peak memory of one attention forward+backward beyond its inputs, ours or SDPA, in this process.

Run once per implementation, each in its own process (max RSS only grows):
  python benchmarks/peak_memory.py ours  --seqlen 8192
  python benchmarks/peak_memory.py sdpa  --seqlen 8192
Shapes: B=1, Hq=32, Hkv=8 (GQA), D=128, float32, causal. Prints the growth of the process's max RSS
over the forward+backward (the inputs and the output gradient are allocated and touched before).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("impl", choices=["ours", "sdpa"])
    p.add_argument("--seqlen", type=int, default=8192)
    p.add_argument("--hq", type=int, default=32)
    p.add_argument("--hkv", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    args = p.parse_args(argv)
    attn_ops = machine.import_attn_ops()  # both processes load the same libraries
    shape_q = (1, args.seqlen, args.hq, args.head_dim)
    shape_kv = (1, args.seqlen, args.hkv, args.head_dim)
    q, dout = torch.randn(shape_q), torch.randn(shape_q)
    k, v = torch.randn(shape_kv), torch.randn(shape_kv)
    if args.impl == "ours":
        q, k, v = (x.requires_grad_() for x in (q, k, v))

        def run():
            attn_ops.attention(q, k, v, causal=True)[0].backward(dout)
    else:  # SDPA takes [B, H, T, D]
        q, k, v = (x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
        dout = dout.transpose(1, 2).contiguous()

        def run():
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).backward(dout)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"{args.impl}: T={args.seqlen} Hq={args.hq} Hkv={args.hkv} D={args.head_dim} float32 causal "
          f"forward+backward: peak memory beyond inputs {(after - before) / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
