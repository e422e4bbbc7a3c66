"""A gpt-oss-shaped attention layer (attention sinks; a 128-token sliding window on every other layer) on
attn_ops against transformers' eager gpt-oss attention, the path a gpt-oss model runs on the CPU today:

    eager: repeat_kv, scores = q k^T * scale + mask, [scores ; sinks] softmax, drop the sink column, P v

Cases, each for the sliding layer (window 128) and the full layer, in --dtype:
  fwdbwd  attn_ops.attention(q, k, v, causal=True, window_left=127 or -1, sinks=...) forward and backward
          (out.sum(), the sinks' gradient included), B=1, T=--seqlen, against eager's;
  decode  one new token per row over a KV cache of --context tokens ([B, Hkv, T, D] storage, as transformers'
          and KVCache's), attn_ops.attention_with_kvcache against eager over the same cache.
Shapes: gpt-oss's 64 query heads, 8 KV heads, head dim 64 (--hq, --hkv, --head-dim). Times: medians of the
two implementations called in turn (benchmarks/lib/timing.py, medians_in_turn).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import machine  # noqa: E402
import reporting  # noqa: E402
import timing  # noqa: E402

attn_ops = machine.import_attn_ops()
WINDOW = 128


def eager(q, k, v, sinks, window, scale):
    """transformers' gpt-oss eager attention: q [B, Hq, Tq, D], k / v [B, Hkv, Tk, D] -> [B, Tq, Hq, D]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    tq, tk = q.shape[2], k.shape[2]
    i = torch.arange(tq)[:, None] + tk - tq
    j = torch.arange(tk)[None, :]
    hidden = (j > i) | ((i - j >= window) if window else torch.zeros_like(j > i))
    scores = scores.masked_fill(hidden, torch.finfo(scores.dtype).min)
    logits = torch.cat([scores, sinks.reshape(1, -1, 1, 1).expand(q.shape[0], -1, tq, 1)], dim=-1)
    probs = torch.softmax(logits - logits.max(dim=-1, keepdim=True).values, dim=-1)[..., :-1].to(v.dtype)
    return torch.matmul(probs, v).transpose(1, 2)


def fwdbwd_calls(args, dtype, window):
    """(ours, eager) callables of one forward + backward, on the same values."""
    B, T = 1, args.seqlen
    make = lambda *s: torch.randn(*s, dtype=dtype).requires_grad_()  # noqa: E731
    q, k, v = make(B, T, args.hq, args.head_dim), make(B, T, args.hkv, args.head_dim), make(B, T, args.hkv,
                                                                                           args.head_dim)
    sinks = torch.randn(args.hq, dtype=dtype).requires_grad_()
    scale = args.head_dim ** -0.5

    def ours():
        out, _ = attn_ops.attention(q, k, v, causal=True, window_left=window - 1 if window else -1, sinks=sinks)
        out.sum().backward()

    def theirs():
        eager(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), sinks, window, scale).sum().backward()

    return ours, theirs


def decode_calls(args, dtype, window):
    B, T = args.batch, args.context
    k = torch.randn(B, args.hkv, T, args.head_dim, dtype=dtype)
    v = torch.randn(B, args.hkv, T, args.head_dim, dtype=dtype)
    q = torch.randn(B, 1, args.hq, args.head_dim, dtype=dtype)
    sinks = torch.randn(args.hq, dtype=dtype)
    lens = torch.full((B,), T, dtype=torch.int32)
    scale = args.head_dim ** -0.5
    ours = lambda: attn_ops.attention_with_kvcache(  # noqa: E731
        q, k.transpose(1, 2), v.transpose(1, 2), lens, window_left=window - 1 if window else -1, sinks=sinks)
    theirs = lambda: eager(q.transpose(1, 2), k, v, sinks, window, scale)  # noqa: E731
    return ours, theirs


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float32"])
    p.add_argument("--seqlen", type=int, default=4096, help="T of the forward+backward cases")
    p.add_argument("--batch", type=int, default=8, help="rows of the decode cases")
    p.add_argument("--context", type=int, default=4096, help="cached tokens per row of the decode cases")
    p.add_argument("--hq", type=int, default=64)
    p.add_argument("--hkv", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3, help="calls of each implementation, in turn")
    p.add_argument("--cases", nargs="+", default=["fwdbwd", "decode"], choices=["fwdbwd", "decode"])
    p.add_argument("--out", help="write the markdown report here")
    args = p.parse_args()
    start = time.time()
    info = machine.machine_info("cpu")
    ceilings = machine.measure_ceilings("cpu", args.dtype)
    rows = []
    for case in args.cases:
        for dtype_name in args.dtype:
            for layer, window in (("sliding", WINDOW), ("full", 0)):
                build = fwdbwd_calls if case == "fwdbwd" else decode_calls
                ours, theirs = build(args, getattr(torch, dtype_name), window)
                ours(), theirs()  # warm-up
                med = timing.medians_in_turn({"ours": ours, "eager": theirs}, args.rounds)
                rows.append([case, dtype_name, layer, reporting.fmt_time(med["ours"]),
                             reporting.fmt_time(med["eager"]), f"{med['eager'] / med['ours']:.2f}x"])
                print(" | ".join(rows[-1]), flush=True)
    lines = [f"# gpt-oss-shaped attention layer (sinks, window {WINDOW}) vs transformers eager", "",
             *reporting.header_lines(info, ceilings, time.time() - start, "cpu"),
             f"- shapes: Hq {args.hq}, Hkv {args.hkv}, D {args.head_dim}; fwdbwd B=1 T={args.seqlen}; decode "
             f"B={args.batch} context {args.context}; medians of {args.rounds} calls in turn", "",
             reporting.markdown_table(["case", "dtype", "layer", "attn_ops", "eager", "speedup"], rows)]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)


if __name__ == "__main__":
    main()
