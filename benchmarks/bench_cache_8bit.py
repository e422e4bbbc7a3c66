"""Decode over 8-bit KV caches (float8_e4m3fn, float8_e5m2) against the bfloat16 cache and PyTorch, in one run.

GQA decode (attn_ops.attention_with_kvcache, one bfloat16 query per row), per (B, context): q [B, 1, Hq, D] over a
full cache stored as attn_ops.nn.KVCache stores it on the CPU (the [B, context, Hkv, D] view of a [B, Hkv, context,
D] tensor), compared on the same values:
  bf16          the bfloat16 cache
  e4m3 / e5m2   the cache quantized to float8 (per-head k_scale / v_scale), converted as it is read
  sdpa          F.scaled_dot_product_attention(enable_gqa=True) over the bfloat16 cache [B, Hkv, context, D]
  sdpa[deq]     what PyTorch offers for an 8-bit cache: dequantize it to bfloat16 (cache.to(bf16) * scale), then sdpa
MLA decode (attn_ops.mla_decode, H query heads, latent 512 + rope 64), per (B, context): the bfloat16 latent cache
against e4m3 / e5m2 latent caches (kv_scale).

GB/s: the bytes of the cache read (its element size) / time, next to the copy bandwidth measured in the same run
(bytes read + written). Times: medians of the implementations called in turn (benchmarks/lib/timing.py).
Differences: max|out - out of bf16 over the dequantized cache| / max|out| (both read the same values: only the
kernels' rounding differs).

  python benchmarks/bench_cache_8bit.py --out benchmarks/results/zen4_cache_8bit.md
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import machine  # noqa: E402
import reporting  # noqa: E402
import timing  # noqa: E402

attn_ops = machine.import_attn_ops()
FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def quantize(x, scale, fmt):
    """x [..., H, D] stored in fmt with per-head scale [H] (as kv_cache_append stores it)."""
    largest = torch.finfo(fmt).max
    return (x.float() / scale.view(-1, 1)).clamp(-largest, largest).to(fmt)


def head_major(x):
    """x [B, T, H, D] as the [B, T, H, D] view of a [B, H, T, D] tensor (KVCache's CPU storage)."""
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def gqa_case(args, B, T):
    g = torch.Generator().manual_seed(B * 7919 + T)
    Hq, Hkv, D = args.hq, args.hkv, args.head_dim
    k = torch.randn(B, T, Hkv, D, generator=g) * 2
    v = torch.randn(B, T, Hkv, D, generator=g)
    q = torch.randn(B, 1, Hq, D, generator=g).bfloat16()
    lens = torch.full((B,), T, dtype=torch.int32)
    k_scale = k.abs().amax(dim=(0, 1, 3)) / 400
    v_scale = v.abs().amax(dim=(0, 1, 3)) / 400
    caches = {"bf16": (head_major(k.bfloat16()), head_major(v.bfloat16()), {})}
    for name, fmt in FORMATS.items():
        caches[name] = (head_major(quantize(k, k_scale, fmt)), head_major(quantize(v, v_scale, fmt)),
                        dict(k_scale=k_scale, v_scale=v_scale))
    del k, v
    calls, outs = {}, {}
    for name, (kc, vc, kw) in caches.items():
        calls[name] = (lambda kc=kc, vc=vc, kw=kw: attn_ops.attention_with_kvcache(q, kc, vc, lens, **kw)[0])
    kh, vh = (t.transpose(1, 2) for t in caches["bf16"][:2])  # [B, Hkv, T, D], contiguous
    qh = q.transpose(1, 2)
    calls["sdpa"] = lambda: F.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True)
    k8, v8 = (t.transpose(1, 2) for t in caches["e4m3"][:2])

    def sdpa_dequantized():
        kd = k8.to(torch.bfloat16) * k_scale.view(1, -1, 1, 1).bfloat16()
        vd = v8.to(torch.bfloat16) * v_scale.view(1, -1, 1, 1).bfloat16()
        return F.scaled_dot_product_attention(qh, kd, vd, enable_gqa=True)

    calls["sdpa[deq]"] = sdpa_dequantized
    # accuracy: each 8-bit run against bf16 attention over the same (dequantized) values
    for name in FORMATS:
        kc, vc, kw = caches[name]
        ref = attn_ops.attention_with_kvcache(q.float(), kc.float() * kw["k_scale"].view(-1, 1),
                                              vc.float() * kw["v_scale"].view(-1, 1), lens)[0]
        outs[name] = float((calls[name]().float() - ref).abs().max() / ref.abs().max())
    bytes_read = {name: 2 * B * T * Hkv * D * (2 if name in ("bf16", "sdpa") else 1) for name in calls}
    return calls, bytes_read, outs


def mla_case(args, B, T):
    g = torch.Generator().manual_seed(B * 31 + T)
    H, d_c, d_r = args.mla_heads, 512, 64
    latent = torch.randn(B, T, d_c + d_r, generator=g)
    q_latent = torch.randn(B, 1, H, d_c, generator=g).bfloat16()
    q_rope = torch.randn(B, 1, H, d_r, generator=g).bfloat16()
    lens = torch.full((B,), T, dtype=torch.int32)
    kv_scale = (latent.abs().amax() / 400).reshape(1)
    scale = (128 + 64) ** -0.5
    caches = {"bf16": (latent.bfloat16(), {})}
    for name, fmt in FORMATS.items():
        caches[name] = (quantize(latent.unsqueeze(-2), kv_scale, fmt)[..., 0, :], dict(kv_scale=kv_scale))
    calls, outs = {}, {}
    for name, (cache, kw) in caches.items():
        calls[name] = (lambda cache=cache, kw=kw: attn_ops.mla_decode(q_latent, q_rope, cache, lens, scale=scale,
                                                                      **kw)[0])
    for name in FORMATS:
        cache, kw = caches[name]
        ref = attn_ops.mla_decode(q_latent.float(), q_rope.float(), cache.float() * kw["kv_scale"], lens,
                                  scale=scale)[0]
        outs[name] = float((calls[name]().float() - ref).abs().max() / ref.abs().max())
    bytes_read = {name: B * T * (d_c + d_r) * (2 if name == "bf16" else 1) for name in calls}
    return calls, bytes_read, outs


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gqa", nargs="*", default=["1x32768", "32x4096"], help="GQA cases, BxCONTEXT")
    p.add_argument("--mla", nargs="*", default=["16x4096"], help="MLA cases, BxCONTEXT")
    p.add_argument("--hq", type=int, default=32)
    p.add_argument("--hkv", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--mla-heads", type=int, default=16)
    p.add_argument("--rounds", type=int, default=7, help="calls of each implementation, in turn")
    p.add_argument("--out", help="write the markdown report here")
    args = p.parse_args()
    start = time.time()
    info = machine.machine_info("cpu")
    ceilings = machine.measure_ceilings("cpu", ["bfloat16"])
    copy_gbs = ceilings["copy"]["gbps"]
    rows = []
    cases = [("GQA", gqa_case, c) for c in args.gqa] + [("MLA", mla_case, c) for c in args.mla]
    for family, build, case in cases:
        B, T = (int(x) for x in case.split("x"))
        calls, bytes_read, diffs = build(args, B, T)
        for fn in calls.values():
            fn()  # warm-up
        med = timing.medians_in_turn(calls, args.rounds)
        for name, seconds in med.items():
            gbs = bytes_read[name] / seconds / 1e9
            rows.append([family, f"B={B} ctx={T}", name, reporting.fmt_time(seconds), f"{gbs:.1f}",
                         f"{gbs / copy_gbs:.0%}", f"{med['bf16'] / seconds:.2f}x",
                         f"{diffs[name]:.1e}" if name in diffs else ""])
            print(" | ".join(rows[-1]), flush=True)
    lines = ["# Decode over 8-bit KV caches vs the bfloat16 cache and PyTorch", "",
             *reporting.header_lines(info, ceilings, time.time() - start, "cpu"),
             f"- GQA: Hq {args.hq}, Hkv {args.hkv}, D {args.head_dim}, bfloat16 q, caches head-major (KVCache's CPU "
             f"storage), per-head scales; MLA: {args.mla_heads} heads, latent 512 + rope 64, bfloat16 queries; "
             f"medians of {args.rounds} calls in turn",
             "- GB/s: cache bytes read / time; % copy: of the copy bandwidth measured in this run; tok/s vs bf16: "
             "the bfloat16 cache's time / this one's; diff: max|out - bf16 attention over the dequantized cache| / "
             "max|out|", "",
             reporting.markdown_table(["model", "case", "cache", "time", "GB/s", "% copy", "tok/s vs bf16", "diff"],
                                      rows)]
    reporting.print_and_write(lines, args.out)


if __name__ == "__main__":
    main()
