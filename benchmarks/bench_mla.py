"""Benchmark MLA absorbed decode (attn_ops.mla_decode, one new token per row) and the latent-cache
append against plain PyTorch, side by side, in one run.

Per (B, context, H): q_latent [B, 1, H, kv_lora_rank] (W_UK folded into the query), q_rope
[B, 1, H, rope_dim], a latent cache of `context` rows of [c_kv ; k_pe] (kv_lora_rank + rope_dim
values each) per batch row, every row attending to all of them, scale 1/sqrt(128 + rope_dim)
(DeepSeek-V2/V3: qk_nope_head_dim 128). Compared on the same values:
  ours          attn_ops.mla_decode over a contiguous latent cache [B, context, 576]
  ours[graph]   the same call captured in a CUDA graph and replayed (CUDA only; no host work)
  paged64       ours over a paged latent cache (block size 64, blocks in shuffled order)
  torch         DeepSeek-V3's own absorbed path in plain PyTorch (inference/model.py, attn_impl
                "absorb"): separate kv_cache [B, T, 512] and pe_cache [B, T, 64] tensors,
                scores = (einsum(q_latent, kv_cache) + einsum(q_rope, pe_cache)) * scale,
                softmax in float32, cast back, einsum(scores, kv_cache)
  sdpa          F.scaled_dot_product_attention as MQA with Dqk 576 / Dv 512 on views of the
                latent cache (q [B, H, 1, 576], k [B, 1, T, 576], v = k[..., :512],
                enable_gqa=True), SDPA's own backend choice (n/a if none takes it)
GB/s = bytes of the latent cache read (B * context * (kv_lora_rank + rope_dim) * element size) /
time, next to the copy bandwidth measured in the same run (bytes read + written). Appends: one
token per row with mla_cache_append (contiguous, at position context - 1, and paged through a
slot per row); GB/s counts bytes read plus written.

Timing as bench_decode.py: CUDA events around each call, L2 flushed before each (outside the
events), warm-up, median of --repeats. CPU: host clock.

Defaults (CUDA): bfloat16, B in {1, 64, 128}, context in {1024, 4096, 16384}, H in {16, 128},
kv_lora_rank 512, rope_dim 64. --quick: B 64, context 4096. On CPU (a smoke test of the script) pass
small sizes, e.g. --batch 2 --context 128 --heads 4 --kv-lora-rank 64 --rope-dim 16.

Examples:
  python benchmarks/bench_mla.py --device cuda --out benchmarks/results/h100_mla.md \\
      --json benchmarks/results/h100_mla.json
  python benchmarks/bench_mla.py --device cuda --quick --time-budget 45
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import baselines  # noqa: E402
import cli  # noqa: E402
import machine  # noqa: E402
import reporting  # noqa: E402
import runner  # noqa: E402
import timing  # noqa: E402
from baselines import DTYPES  # noqa: E402

CUDA_IMPLS = ["ours", "ours[graph]", "paged64", "torch", "sdpa"]
CPU_IMPLS = ["ours", "paged64", "torch", "sdpa"]
QK_NOPE_HEAD_DIM = 128


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_common_args(p)
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    p.add_argument("--batch", type=int, nargs="+", help="default 1 64 128 (--quick: 64)")
    p.add_argument("--context", type=int, nargs="+",
                   help="cached tokens per row; default 1024 4096 16384 (--quick: 4096)")
    p.add_argument("--heads", type=int, nargs="+", help="default 16 128")
    p.add_argument("--kv-lora-rank", type=int, default=512)
    p.add_argument("--rope-dim", type=int, default=64)
    p.add_argument("--block-size", type=int, default=64, help="paged cache block size")
    p.add_argument("--impls", nargs="+", help=f"subset; default cuda {CUDA_IMPLS}, cpu {CPU_IMPLS}")
    p.add_argument("--quick", action="store_true", help="B 64, context 4096, 10 repeats")
    args = p.parse_args(argv)
    cli.finish_common_args(p, args)
    args.batch = args.batch or ([64] if args.quick else [1, 64, 128])
    args.context = args.context or ([4096] if args.quick else [1024, 4096, 16384])
    args.heads = args.heads or [16, 128]
    args.impls = [f"paged{args.block_size}" if i.startswith("paged") else i
                  for i in cli.select_impls(args, CUDA_IMPLS, CPU_IMPLS, ("ours[graph]",))]
    for ctx in args.context:
        if ctx % args.block_size:
            p.error(f"--context must be a multiple of --block-size {args.block_size}, got {ctx}")
    return args


def absorbed_torch(q_latent, q_rope, kv_cache, pe_cache, scale):
    """DeepSeek-V3 inference/model.py, attn_impl == "absorb" (no mask: one query per row)."""
    scores = (torch.einsum("bshc,btc->bsht", q_latent, kv_cache) +
              torch.einsum("bshr,btr->bsht", q_rope, pe_cache)) * scale
    scores = scores.softmax(dim=-1, dtype=torch.float32).type_as(q_latent)
    return torch.einsum("bsht,btc->bshc", scores, kv_cache)


def mla_case(attn_ops, args, b, ctx, h, seed, label, notes):
    device, dtype = args.device, DTYPES[args.dtype]
    d_c, d_r = args.kv_lora_rank, args.rope_dim
    elem = torch.empty((), dtype=dtype).element_size()
    cache_bytes = b * ctx * (d_c + d_r) * elem
    row = {"B": b, "context": ctx, "H": h, "kv_lora_rank": d_c, "rope_dim": d_r,
           "dtype": args.dtype, "cache_bytes": cache_bytes, "impls": {}, "appends": {}}
    if not machine.fits(2 * cache_bytes + 3 * b * h * ctx * 4, device):
        return runner.all_oom(row, args.impls, "estimated cache + a copy + scores > 80% of free "
                              "memory", notes, label)
    gen = baselines.generator(device, seed)
    cache = baselines.randn((b, ctx, d_c + d_r), dtype, device, gen)
    q_latent = baselines.randn((b, 1, h, d_c), dtype, device, gen)
    q_rope = baselines.randn((b, 1, h, d_r), dtype, device, gen)
    lens = torch.full((b,), ctx, dtype=torch.int32, device=device)
    scale = 1.0 / math.sqrt(QK_NOPE_HEAD_DIM + d_r)
    outs = {}

    def record(impl, entry, out):
        row["impls"][impl] = entry
        reporting.note(notes, impl, entry, label)
        if out is not None:
            outs[impl] = out.detach().reshape(b, h, d_c).float()

    def ours_call(c, **kw):
        return lambda: attn_ops.mla_decode(q_latent, q_rope, c, lens, scale=scale, **kw)[0]

    contiguous = cache

    for impl in args.impls:
        if impl == "ours":
            def make():
                return ours_call(contiguous)
        elif impl == "ours[graph]":
            def make():
                graph, out = timing.cuda_graph(ours_call(contiguous))
                return lambda: (graph.replay(), out)[1]
        else:
            continue
        record(impl, *runner.timed_entry(make, device=device, args=args, nbytes=cache_bytes))
    row["appends"].update(append_decode(attn_ops, args, cache, None, None, label, notes))

    for impl in [i for i in args.impls if i.startswith("paged")]:
        bs = args.block_size
        try:
            (pool,), bt = baselines.paged_copies([cache], bs, gen)
        except Exception as e:  # noqa: BLE001
            record(impl, {"status": "OOM" if runner.is_oom(e) else "n/a",
                          "why": runner.first_line(e)}, None)
            continue
        record(impl, *runner.timed_entry(lambda pool=pool, bt=bt: ours_call(pool, block_table=bt),
                                         device=device, args=args, nbytes=cache_bytes))
        row["appends"].update(append_decode(attn_ops, args, cache, pool, bt, label, notes))
        del pool, bt
        machine.free_memory(device)

    with torch.no_grad():
        if "torch" in args.impls:
            kv_cache, pe_cache = cache[..., :d_c].contiguous(), cache[..., d_c:].contiguous()
            record("torch", *runner.timed_entry(
                lambda: (lambda: absorbed_torch(q_latent, q_rope, kv_cache, pe_cache, scale)),
                device=device, args=args, nbytes=cache_bytes))
            del kv_cache, pe_cache
        if "sdpa" in args.impls:
            qs = torch.cat([q_latent, q_rope], dim=-1).transpose(1, 2)   # [B, H, 1, 576]
            ks = cache.unsqueeze(1)                                      # [B, 1, T, 576]
            vs = ks[..., :d_c]

            def make():
                return lambda: F.scaled_dot_product_attention(qs, ks, vs, scale=scale,
                                                              enable_gqa=True).transpose(1, 2)

            record("sdpa", *runner.timed_entry(make, device=device, args=args, nbytes=cache_bytes))
    del cache
    machine.free_memory(device)
    if "ours" in outs and "torch" in outs:
        row["rel_diff_vs_torch"] = baselines.rel_maxdiff(outs["ours"], outs["torch"])
    paged = [baselines.rel_maxdiff(outs[i], outs["ours"]) for i in outs if i.startswith("paged")
             and "ours" in outs]
    if paged:
        row["rel_diff_paged_vs_contiguous"] = max(paged)
    return row


def append_decode(attn_ops, args, cache, pool, bt, label, notes):
    """One latent row per batch row, written at position context - 1 with the values already
    there (the caches keep their contents); contiguous (pool None) or paged."""
    b, ctx, _ = cache.shape
    d_c = args.kv_lora_rank
    c_kv, k_pe = cache[:, -1:, :d_c].clone(), cache[:, -1:, d_c:].clone()
    nbytes = 2 * (c_kv.numel() + k_pe.numel()) * c_kv.element_size()
    if pool is None:
        name = "append"
        pos = torch.full((b,), ctx - 1, dtype=torch.int32, device=cache.device)

        def make():
            return lambda: attn_ops.mla_cache_append(cache, c_kv, k_pe, cache_seqlens=pos)
    else:
        bs = pool.shape[1]
        name = f"append paged{bs}"
        slots = (bt[:, (ctx - 1) // bs].long() * bs + (ctx - 1) % bs).to(torch.int32)
        ct, kt = c_kv.reshape(b, d_c), k_pe.reshape(b, -1)

        def make():
            return lambda: attn_ops.mla_cache_append(pool, ct, kt, slot_mapping=slots)
    entry, _ = runner.timed_entry(make, device=args.device, args=args, nbytes=nbytes)
    reporting.note(notes, name, entry, label)
    return {name: entry}


def render_markdown(run, results):
    args, cp = run.args, run.ceilings["copy"]["gbps"]
    L = ["# attn_ops MLA decode benchmark (mla_decode, mla_cache_append)", ""]
    L += reporting.header_lines(run.info, run.ceilings, run.elapsed(), args.device)
    L.append("")
    L.append(f"Absorbed MLA decode: one query token per row, kv_lora_rank {args.kv_lora_rank}, "
             f"rope_dim {args.rope_dim}, {args.dtype}, every row attends to the whole context. "
             f"Cells: median time (GB/s of the latent cache read). X/ours = X time / ours time "
             f"(> 1: attn_ops is faster), against ours on the contiguous cache. ours % copy = ours' "
             f"GB/s / the copy bandwidth measured above ({cp:.0f} GB/s). ours[graph] = the same call "
             f"replayed from a CUDA graph (no host work). paged{args.block_size} = ours over a "
             f"paged latent cache. torch = DeepSeek-V3's absorbed path in plain PyTorch (einsum, "
             f"separate kv/pe caches); sdpa = SDPA as MQA (Dqk = kv_lora_rank + rope_dim, Dv = "
             f"kv_lora_rank) on views of the latent cache. rel. diff: max abs(ours - torch) / max "
             f"abs(torch); paged diff: the same for paged against contiguous.")
    L.append("")
    keys = [("B", lambda r: r["B"]), ("context", lambda r: r["context"]), ("H", lambda r: r["H"]),
            ("cache", lambda r: reporting.fmt_bytes(r["cache_bytes"]))]
    L += reporting.bandwidth_tables(
        results, keys, args.impls, cp,
        [("rel. diff", "rel_diff_vs_torch"), ("paged diff", "rel_diff_paged_vs_contiguous")],
        "Latent-cache appends (one row per batch row): median time (GB/s, bytes read + written); "
        "latency-bound at these sizes.")
    L += compute_lines(run, results)
    L += reporting.skipped_lines(run.notes)
    return "\n".join(L)


def mla_flops(r):
    """Floating-point operations of one absorbed decode: per head and cached row, a dot product over
    kv_lora_rank + rope_dim (scores) and an axpy over kv_lora_rank (values), 2 flops per multiply-add."""
    return 2 * r["B"] * r["H"] * r["context"] * (2 * r["kv_lora_rank"] + r["rope_dim"])


def compute_lines(run, results):
    """MLA decode is compute-bound at H >= 16 (16+ flops per float32 byte): GFLOP/s of every
    implementation next to the float32 matmul rate measured in this run."""
    mm = machine.matmul_gflops(run.ceilings, "float32")
    impls = [i for i in run.args.impls if i != "ours[graph]"]
    rows = []
    for r in results:
        cells = []
        for i in impls:
            e = r["impls"].get(i)
            cells.append(f"{mla_flops(r) / (e['median_ms'] / 1e3) / 1e9:.1f}" if e and e["status"] == "ok"
                         else (e["status"] if e else "-"))
        o = r["impls"].get("ours")
        share = (f"{100 * mla_flops(r) / (o['median_ms'] / 1e3) / 1e9 / mm:.0f}%"
                 if o and o["status"] == "ok" and mm else "-")
        rows.append([str(r["B"]), str(r["context"]), str(r["H"])] + cells + [share])
    return ["", f"Compute: GFLOP/s (2 x B x H x context x (2 kv_lora_rank + rope_dim) / median time) next "
            f"to the float32 matmul rate measured above ({mm:.1f} GFLOP/s).", "",
            reporting.markdown_table(["B", "context", "H"] + [f"{i} GFLOP/s" for i in impls] + ["ours % fp32 matmul"],
                                  rows)]


def main(argv=None) -> int:
    args = parse_args(argv)
    run = runner.Run(args, [args.dtype])
    results = []

    def report(final):
        return run.write(render_markdown(run, results), {"decode": results}, final)

    cases = [(b, ctx, h) for h in args.heads for ctx in sorted(args.context)
             for b in sorted(args.batch)]
    for ci, (b, ctx, h), label in run.each(cases, "mla B={} context={} H={}".format):
        results.append(mla_case(run.attn_ops, args, b, ctx, h, args.seed + ci, label, run.notes))
        print(reporting.bw_line(label, results[-1], args.impls, "rel_diff_vs_torch", "rel.diff"),
              flush=True)
        report(final=False)
    report(final=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
