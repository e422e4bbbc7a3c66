"""The attention layers of models with today's patterns on attn_ops against transformers' eager attention of
those models, the path they run on the CPU today (--model):

  gpt-oss  attention sinks, a 128-token sliding window on every other layer; eager: repeat_kv,
           scores = q k^T * scale + mask, [scores ; sinks] softmax, drop the sink column, P v
  bloom    ALiBi (BLOOM, MPT); eager: alibi.baddbmm(q, k^T) with the slopes times the key positions, causal
           mask, softmax in float32, P v

Cases, for each layer of the model (gpt-oss: sliding and full; bloom: its one kind), in --dtype:
  fwdbwd  attn_ops.attention(q, k, v, causal=True, ...) forward and backward (out.sum(), the sinks' gradient
          included), B=1, T=--seqlen, against eager's;
  decode  one new token per row over a KV cache of --context tokens ([B, Hkv, T, D] storage, as transformers'
          and KVCache's), attn_ops.attention_with_kvcache against eager over the same cache.
Shapes: gpt-oss's 64 query heads, 8 KV heads, head dim 64; BLOOM-7B's 32 heads (MHA), head dim 128
(--hq, --hkv, --head-dim override them). Times: medians of the two implementations called in turn
(benchmarks/lib/timing.py, medians_in_turn).

  python benchmarks/bench_patterns.py --out benchmarks/results/zen4_patterns.md
  python benchmarks/bench_patterns.py --model bloom --seqlen 2048 --out benchmarks/results/zen4_patterns_bloom.md
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


def eager_bloom(q, k, v, slopes, scale):
    """transformers' BLOOM eager attention: q [B, H, Tq, D], k / v [B, H, Tk, D] -> [B, Tq, H, D]. Its ALiBi is
    slope * key position, which under the causal mask differs from -slope * |i - j| by a constant per row."""
    B, H, tq, D = q.shape
    tk = k.shape[2]
    alibi = (slopes.view(H, 1, 1) * torch.arange(tk).view(1, 1, tk)).to(q.dtype).repeat(B, 1, 1)
    scores = alibi.baddbmm(q.reshape(B * H, tq, D), k.reshape(B * H, tk, D).transpose(1, 2), beta=1.0, alpha=scale)
    i = torch.arange(tq)[:, None] + tk - tq
    scores = scores.view(B, H, tq, tk).masked_fill(torch.arange(tk)[None, :] > i, torch.finfo(q.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    return torch.matmul(probs, v).transpose(1, 2)


# Per model: its shapes (hq, hkv, head_dim) and layers, each (name, the op's pattern options, the eager call of
# q [B, Hq, Tq, D], k / v [B, Hkv, Tk, D] given those options and the scale).
def gpt_oss_layer(window):
    options = lambda sinks, slopes: dict(window_left=window - 1 if window else -1, sinks=sinks)  # noqa: E731
    return ("sliding" if window else "full", options,
            lambda q, k, v, sinks, slopes, scale: eager(q, k, v, sinks, window, scale))


MODELS = {
    "gpt-oss": dict(title=f"gpt-oss-shaped attention layer (sinks, window {WINDOW})", hq=64, hkv=8, head_dim=64,
                    sinks=True, layers=[gpt_oss_layer(WINDOW), gpt_oss_layer(0)]),
    "bloom": dict(title="BLOOM-shaped attention layer (ALiBi)", hq=32, hkv=32, head_dim=128, sinks=False,
                  layers=[("alibi", lambda sinks, slopes: dict(alibi_slopes=slopes),
                           lambda q, k, v, sinks, slopes, scale: eager_bloom(q, k, v, slopes, scale))]),
}


def pattern_tensors(args, dtype, requires_grad):
    """(sinks [Hq] or None, ALiBi slopes [Hq] float32)."""
    sinks = torch.randn(args.hq, dtype=dtype).requires_grad_(requires_grad) if MODELS[args.model]["sinks"] else None
    return sinks, attn_ops.alibi_slopes(args.hq)


def fwdbwd_calls(args, dtype, layer):
    """(ours, eager) callables of one forward + backward, on the same values."""
    _, options, eager_call = layer
    B, T = 1, args.seqlen
    make = lambda *s: torch.randn(*s, dtype=dtype).requires_grad_()  # noqa: E731
    q, k, v = make(B, T, args.hq, args.head_dim), make(B, T, args.hkv, args.head_dim), make(B, T, args.hkv,
                                                                                           args.head_dim)
    sinks, slopes = pattern_tensors(args, dtype, True)
    scale = args.head_dim ** -0.5

    def ours():
        out, _ = attn_ops.attention(q, k, v, causal=True, **options(sinks, slopes))
        out.sum().backward()

    def theirs():
        eager_call(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), sinks, slopes, scale).sum().backward()

    return ours, theirs


def decode_calls(args, dtype, layer):
    _, options, eager_call = layer
    B, T = args.batch, args.context
    k = torch.randn(B, args.hkv, T, args.head_dim, dtype=dtype)
    v = torch.randn(B, args.hkv, T, args.head_dim, dtype=dtype)
    q = torch.randn(B, 1, args.hq, args.head_dim, dtype=dtype)
    sinks, slopes = pattern_tensors(args, dtype, False)
    lens = torch.full((B,), T, dtype=torch.int32)
    scale = args.head_dim ** -0.5
    ours = lambda: attn_ops.attention_with_kvcache(  # noqa: E731
        q, k.transpose(1, 2), v.transpose(1, 2), lens, **options(sinks, slopes))
    theirs = lambda: eager_call(q.transpose(1, 2), k, v, sinks, slopes, scale)  # noqa: E731
    return ours, theirs


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float32"])
    p.add_argument("--seqlen", type=int, default=4096, help="T of the forward+backward cases")
    p.add_argument("--batch", type=int, default=8, help="rows of the decode cases")
    p.add_argument("--context", type=int, default=4096, help="cached tokens per row of the decode cases")
    p.add_argument("--model", default="gpt-oss", choices=list(MODELS))
    p.add_argument("--hq", type=int, help="query heads (default: the model's)")
    p.add_argument("--hkv", type=int, help="KV heads (default: the model's)")
    p.add_argument("--head-dim", type=int, help="head dim (default: the model's)")
    p.add_argument("--rounds", type=int, default=3, help="calls of each implementation, in turn")
    p.add_argument("--cases", nargs="+", default=["fwdbwd", "decode"], choices=["fwdbwd", "decode"])
    p.add_argument("--out", help="write the markdown report here")
    args = p.parse_args()
    model = MODELS[args.model]
    for name in ("hq", "hkv", "head_dim"):
        if getattr(args, name) is None:
            setattr(args, name, model[name])
    start = time.time()
    info = machine.machine_info("cpu")
    ceilings = machine.measure_ceilings("cpu", args.dtype)
    rows = []
    for case in args.cases:
        for dtype_name in args.dtype:
            for layer in model["layers"]:
                build = fwdbwd_calls if case == "fwdbwd" else decode_calls
                ours, theirs = build(args, getattr(torch, dtype_name), layer)
                ours(), theirs()  # warm-up
                med = timing.medians_in_turn({"ours": ours, "eager": theirs}, args.rounds)
                rows.append([case, dtype_name, layer[0], reporting.fmt_time(med["ours"]),
                             reporting.fmt_time(med["eager"]), f"{med['eager'] / med['ours']:.2f}x"])
                print(" | ".join(rows[-1]), flush=True)
    lines = [f"# {model['title']} vs transformers eager", "",
             *reporting.header_lines(info, ceilings, time.time() - start, "cpu"),
             f"- shapes: Hq {args.hq}, Hkv {args.hkv}, D {args.head_dim}; fwdbwd B=1 T={args.seqlen}; decode "
             f"B={args.batch} context {args.context}; medians of {args.rounds} calls in turn", "",
             reporting.markdown_table(["case", "dtype", "layer", "attn_ops", "eager", "speedup"], rows)]
    reporting.print_and_write(lines, args.out)


if __name__ == "__main__":
    main()
