"""Benchmark GQA decode (attn_ops.attention_with_kvcache, one new token per row) and the KV-cache
appends against PyTorch's paths, side by side, in one run.

Decode, per (B, context, Hkv): q [B, 1, Hq, D]; every row attends to `context` cached keys (a full
cache, cache_seqlens = context). Compared on the same values:
  ours          attn_ops.attention_with_kvcache over a contiguous cache [B, context, Hkv, D]
  ours[huge]    the same call over a copy of the cache in transparent huge pages (CPU, Linux; how
                attn_ops.nn.KVCache allocated before it stored its CPU layers head-major, as PagedKVCache
                now does too: attn_ops/_huge_pages.py)
  ours[graph]   the same call captured in a CUDA graph and replayed (CUDA only): no host work per
                call (the op's value checks, which copy cache_seqlens to the host, are skipped
                under capture), so this is the kernels' own time
  paged16 / paged1   ours over a paged cache (block size 16 / 1, blocks in shuffled order,
                block_table int32 [B, context / block_size])
  paged16[nn]   paged16's blocks and table in attn_ops.nn.PagedKVCache's storage (CPU: each layer's k / v
                the transposed view of a [num_blocks, Hkv, 16, D] tensor in transparent huge pages)
  ours[nn]      the same call over attn_ops.nn.KVCache's storage holding the same values (CPU: each layer's
                k / v the transposed view of a [B, Hkv, context, D] tensor in transparent huge pages)
  ours[bhtd]    ours over the baselines' [B, Hkv, context, D] cache (HF's layout), passed as the
                view .transpose(1, 2), which the op reads in place: the same bytes in the same order
                as sdpa's
  ours[dense]   attn_ops.attention (the dense op, causal) on the same views: the call transformers'
                generation steps make through attn_ops.integrations.transformers
  sdpa          F.scaled_dot_product_attention(q [B,Hq,1,D], k/v [B,Hkv,context,D], enable_gqa=True)
  flex          torch.compile(flex_attention)(..., enable_gqa=True), no mask (CUDA only)
  eager         HuggingFace's eager path: repeat_kv + q @ k^T * scale + softmax(float32) + @ v
The baselines read a contiguous [B, Hkv, context, D] cache (HF's layout; no paged form); their
ratios are against ours on the contiguous cache. GB/s = bytes of the K and V cache read
(2 * B * context * Hkv * D * element size) / time, next to the copy bandwidth measured in the same
run (bytes read + written of a large device-to-device copy) and the read bandwidth (bytes read by a
sum over 1 GiB, 2 GiB on a GPU: decode only reads the cache).

Appends: decode appends (one token per row, at position context - 1: kv_cache_append, and
paged_kv_cache_append with a slot per row) per case, and bulk appends (--append-tokens new tokens
for each of --append-batch rows: a prefill chunk) into contiguous and paged caches; GB/s counts
the bytes read plus written (2 x the new K and V).

Mixed serving step (continuous batching): --mixed-decode rows decode one token each over
--mixed-context cached keys, and one row prefills a --mixed-prefill token chunk (its cache holds
the chunk and --mixed-context earlier keys), all over one paged cache (block size 16). Compared:
  ragged        one attention_with_kvcache call with packed q [rows + chunk, Hq, D] and cu_seqlens_q
  padded        one dense call, every row's q padded to the chunk length [rows + 1, chunk, Hq, D]
                (the padding queries are computed and thrown away)
  split         two calls: the decode rows (q [rows, 1, Hq, D]) and the prefill row (q [1, chunk, Hq, D])
The outputs of the real queries are compared (rel. diff against ragged). --mixed-only runs just this.

Timing: CUDA events around each call, after warm-up, median of --repeats; before each call a
buffer of twice the L2 size is written, so every call reads the cache from device memory (as
triton.testing.do_bench; the flush is outside the events). CPU: host clock. A case is skipped
("OOM") when its estimated peak memory exceeds 80% of the free memory: the cache, a paged or
[B, Hkv, T, D] copy of it, and for eager the Hq/Hkv-fold repeated K/V and the scores.

Defaults (CUDA): bfloat16, B in {1, 32, 128}, context in {1024, 8192, 32768}, Hq 32,
Hkv in {8, 1}, D 128. --quick: B 32, context 8192. On CPU (a smoke test of the script; CUDA-only
paths are skipped) pass small sizes, e.g. --batch 2 --context 64 --hq 4 --hkv 2 --head-dim 32.

Examples:
  python benchmarks/bench_decode.py --device cuda --out benchmarks/results/h100_decode.md \\
      --json benchmarks/results/h100_decode.json
  python benchmarks/bench_decode.py --device cuda --quick --time-budget 60
  python benchmarks/bench_decode.py --mixed-only --hq 8 --hkv 2 --head-dim 64   # the mixed step on CPU
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
from reporting import bw_cell  # noqa: E402

CUDA_IMPLS = ["ours", "ours[graph]", "ours[nn]", "ours[bhtd]", "ours[dense]", "paged16", "paged1", "sdpa", "flex",
              "eager"]
CPU_IMPLS = ["ours", "ours[huge]", "ours[nn]", "ours[bhtd]", "ours[dense]", "paged16", "paged16[nn]", "paged1", "sdpa",
             "eager"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_common_args(p)
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    p.add_argument("--batch", type=int, nargs="+", help="default 1 32 128 (--quick: 32)")
    p.add_argument("--context", type=int, nargs="+",
                   help="cached tokens per row; default 1024 8192 32768 (--quick: 8192)")
    p.add_argument("--hq", type=int, default=32)
    p.add_argument("--hkv", type=int, nargs="+", help="default 8 1")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--impls", nargs="+", help=f"subset; default cuda {CUDA_IMPLS}, cpu {CPU_IMPLS}")
    p.add_argument("--append-batch", type=int, default=None, help="bulk appends: rows (default 16)")
    p.add_argument("--append-tokens", type=int, default=None,
                   help="bulk appends: new tokens per row (default 1024); 0 skips them")
    p.add_argument("--quick", action="store_true", help="B 32, context 8192, 10 repeats")
    p.add_argument("--mixed-decode", type=int, default=31, help="mixed step: decoding rows (default 31)")
    p.add_argument("--mixed-prefill", type=int, default=512, help="mixed step: prefill chunk (default 512)")
    p.add_argument("--mixed-context", type=int, default=1024,
                   help="mixed step: cached keys of every row before this step (default 1024)")
    p.add_argument("--mixed-only", action="store_true", help="run only the mixed serving step")
    args = p.parse_args(argv)
    cli.finish_common_args(p, args)
    args.batch = args.batch or ([32] if args.quick else [1, 32, 128])
    args.context = args.context or ([8192] if args.quick else [1024, 8192, 32768])
    args.hkv = args.hkv or [8, 1]
    args.impls = cli.select_impls(args, CUDA_IMPLS, CPU_IMPLS, ("ours[graph]", "flex"))
    if args.device == "cuda":
        args.impls = [i for i in args.impls if i != "ours[huge]"]  # host memory only
    args.append_batch = args.append_batch if args.append_batch is not None else 16
    args.append_tokens = args.append_tokens if args.append_tokens is not None else 1024
    for hkv in args.hkv:
        if hkv < 1 or args.hq % hkv:
            p.error(f"--hq {args.hq} must be a multiple of every --hkv (got {hkv})")
    for ctx in args.context:
        if ctx % 16:
            p.error(f"--context must be a multiple of 16 (the paged block size), got {ctx}")
    return args


def block_size_of(impl):
    return int(impl[len("paged"):].removesuffix("[nn]")) if impl.startswith("paged") else None


def decode_case(attn_ops, args, b, ctx, hkv, seed, label, notes, budget):
    """Times every implementation on one decode case; returns the row dict."""
    device, dtype, hq, d = args.device, DTYPES[args.dtype], args.hq, args.head_dim
    elem = torch.empty((), dtype=dtype).element_size()
    cache_bytes = 2 * b * ctx * hkv * d * elem
    row = {"B": b, "context": ctx, "Hq": hq, "Hkv": hkv, "D": d, "dtype": args.dtype,
           "cache_bytes": cache_bytes, "impls": {}, "appends": {}}
    if not machine.fits(2 * cache_bytes, device):
        return runner.all_oom(row, args.impls, f"estimated {reporting.fmt_bytes(2 * cache_bytes)} "
                              "(cache + a copy) > 80% of free memory", notes, label)
    gen = baselines.generator(device, seed)
    k = baselines.randn((b, ctx, hkv, d), dtype, device, gen)
    v = baselines.randn((b, ctx, hkv, d), dtype, device, gen)
    q = baselines.randn((b, 1, hq, d), dtype, device, gen)
    lens = torch.full((b,), ctx, dtype=torch.int32, device=device)
    scale = 1.0 / math.sqrt(d)
    outs = {}

    def record(impl, entry, out):
        row["impls"][impl] = entry
        reporting.note(notes, impl, entry, label)
        if out is not None:
            outs[impl] = out.detach().reshape(b, hq, d).float()

    # ours: contiguous, graph, paged
    for impl in [i for i in args.impls if i in ("ours", "ours[graph]")]:
        if impl == "ours":
            def make():
                return lambda: attn_ops.attention_with_kvcache(q, k, v, lens)[0]
        else:
            def make():
                graph, out = timing.cuda_graph(lambda: attn_ops.attention_with_kvcache(q, k, v, lens)[0])
                return lambda: (graph.replay(), out)[1]
        record(impl, *runner.timed_entry(make, device=device, args=args, nbytes=cache_bytes))
    if "ours[huge]" in args.impls:
        from attn_ops import _huge_pages  # attn_ops itself is imported (machine.import_attn_ops) by now

        kh, vh = (_huge_pages.zeros(*t.shape, dtype=dtype, device=device).copy_(t) for t in (k, v))

        def make():
            return lambda: attn_ops.attention_with_kvcache(q, kh, vh, lens)[0]
        record("ours[huge]", *runner.timed_entry(make, device=device, args=args, nbytes=cache_bytes))
        del kh, vh
    if "ours[nn]" in args.impls:
        cache = attn_ops.nn.KVCache(1, b, ctx, hkv, d, dtype=dtype, device=device)
        cache.k[0].copy_(k)
        cache.v[0].copy_(v)

        def make():
            return lambda: attn_ops.attention_with_kvcache(q, cache.k[0], cache.v[0], lens)[0]
        record("ours[nn]", *runner.timed_entry(make, device=device, args=args, nbytes=cache_bytes))
        del cache
    for impl in [i for i in args.impls if i.startswith("paged")]:
        bs = block_size_of(impl)
        try:
            (kp, vp), bt = baselines.paged_copies([k, v], bs, gen)
        except Exception as e:  # noqa: BLE001
            record(impl, {"status": "OOM" if runner.is_oom(e) else "n/a", "why": runner.first_line(e)},
                   None)
            continue

        if impl.endswith("[nn]"):  # the same blocks in the module cache's storage
            cache = attn_ops.nn.PagedKVCache(1, kp.shape[0], bs, hkv, d, b, ctx // bs, dtype=dtype, device=device)
            kp, vp = cache.k[0].copy_(kp), cache.v[0].copy_(vp)

        def make(kp=kp, vp=vp, bt=bt):
            return lambda: attn_ops.attention_with_kvcache(q, kp, vp, lens, block_table=bt)[0]

        record(impl, *runner.timed_entry(make, device=device, args=args, nbytes=cache_bytes))
        if not impl.endswith("[nn]"):
            row["appends"].update(append_decode(attn_ops, args, k, v, kp, vp, bt, bs, lens, label, notes))
        kp = vp = bt = cache = None  # (cache: paged16[nn]'s storage)
        machine.free_memory(device)
    row["appends"].update(append_decode(attn_ops, args, k, v, None, None, None, None, lens, label,
                                        notes))

    # baselines on a [B, Hkv, context, D] cache, and ours on the same bytes
    if any(i in args.impls for i in ("ours[bhtd]", "ours[dense]", "sdpa", "flex", "eager")):
        kb, vb = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
        del k, v
        machine.free_memory(device)
        kt, vt = kb.transpose(1, 2), vb.transpose(1, 2)
        on_views = {"ours[bhtd]": lambda: attn_ops.attention_with_kvcache(q, kt, vt, lens)[0],
                    "ours[dense]": lambda: attn_ops.attention(q, kt, vt, causal=True)[0]}
        for impl in [i for i in args.impls if i in on_views]:
            record(impl, *runner.timed_entry(lambda call=on_views[impl]: call, device=device, args=args,
                                             nbytes=cache_bytes))
        qb = q.transpose(1, 2).contiguous()  # [B, Hq, 1, D]
        for impl in [i for i in args.impls if i in ("sdpa", "flex", "eager")]:
            if impl != "sdpa" and budget.expired():
                record(impl, {"status": "skipped",
                              "why": f"--time-budget {args.time_budget:g} s spent"}, None)
                continue
            if impl == "eager":
                n_rep = hq // hkv
                est = cache_bytes * n_rep + b * hq * ctx * (4 + 4 + elem)
                if not machine.fits(est, device):
                    record(impl, {"status": "OOM", "why": f"estimated {reporting.fmt_bytes(est)} for the "
                                  "repeated K/V and scores > 80% of free memory"}, None)
                    continue

                def make():
                    return lambda: baselines.eager_attention(qb, kb, vb, None, scale)
            elif impl == "sdpa":
                def make():
                    return lambda: F.scaled_dot_product_attention(qb, kb, vb, enable_gqa=True)
            else:
                def make():
                    fn = baselines.flex_compiled()
                    call = lambda: fn(qb, kb, vb, enable_gqa=True)  # noqa: E731
                    call()  # compile outside the timing
                    return call

            def run(make=make):
                with torch.no_grad():
                    return runner.timed_entry(make, device=device, args=args, nbytes=cache_bytes)

            entry, out = run()
            record(impl, entry, out.transpose(1, 2) if out is not None else None)
        del kb, vb
    machine.free_memory(device)
    if "ours" in outs and "sdpa" in outs:
        row["rel_diff_vs_sdpa"] = baselines.rel_maxdiff(outs["ours"], outs["sdpa"])
    paged_diffs = [baselines.rel_maxdiff(outs[i], outs["ours"]) for i in outs
                   if (i.startswith("paged") or i in ("ours[bhtd]", "ours[dense]", "ours[huge]", "ours[nn]"))
                   and "ours" in outs]
    if paged_diffs:
        row["rel_diff_paged_vs_contiguous"] = max(paged_diffs)
    return row


def append_decode(attn_ops, args, k, v, kp, vp, bt, bs, lens, label, notes):
    """Decode appends (one token per row, written at position context - 1) into the contiguous
    cache (kp None) or the paged one; returns {name: entry}."""
    device = args.device
    b, ctx, hkv, d = k.shape
    # the values already cached there: the caches keep their contents (the baselines read them later)
    k_new, v_new = k[:, -1:].clone(), v[:, -1:].clone()
    nbytes = 2 * 2 * k_new.numel() * k_new.element_size()  # K and V, read + written
    if kp is None:
        name = "append"
        pos = lens - 1

        def make():
            return lambda: attn_ops.kv_cache_append(k, v, k_new, v_new, pos)
    else:
        name = f"append paged{bs}"
        last = ctx - 1
        slots = (bt[:, last // bs].long() * bs + last % bs).to(torch.int32)

        def make():
            kt, vt = k_new.reshape(b, hkv, d), v_new.reshape(b, hkv, d)
            return lambda: attn_ops.paged_kv_cache_append(kp, vp, kt, vt, slots)
    entry, _ = runner.timed_entry(make, device=device, args=args, nbytes=nbytes)
    reporting.note(notes, name, entry, label)
    return {name: entry}


def bulk_appends(attn_ops, args, notes):
    """Prefill-chunk appends: --append-tokens new tokens for each of --append-batch rows."""
    device, dtype, d = args.device, DTYPES[args.dtype], args.head_dim
    b, t = args.append_batch, args.append_tokens
    rows = []
    for hkv in args.hkv:
        label = f"bulk append B={b} Tnew={t} Hkv={hkv}"
        gen = baselines.generator(device, 2)
        k_new = baselines.randn((b, t, hkv, d), dtype, device, gen)
        v_new = baselines.randn((b, t, hkv, d), dtype, device, gen)
        nbytes = 2 * 2 * k_new.numel() * k_new.element_size()
        cap = t + 16
        row = {"B": b, "Tnew": t, "Hkv": hkv, "D": d, "bytes": nbytes, "impls": {}}
        kc = torch.empty(b, cap, hkv, d, dtype=dtype, device=device)
        vc = torch.empty_like(kc)
        lens = torch.full((b,), 16, dtype=torch.int32, device=device)

        def make(kc=kc, vc=vc, k_new=k_new, v_new=v_new, lens=lens):
            return lambda: attn_ops.kv_cache_append(kc, vc, k_new, v_new, lens)

        row["impls"]["contiguous"], _ = runner.timed_entry(make, device=device, args=args,
                                                           nbytes=nbytes)
        for bs in (16, 1):
            nblk = b * (-(-t // bs)) + 2
            kp = torch.empty(nblk, bs, hkv, d, dtype=dtype, device=device)
            vp = torch.empty_like(kp)
            slots = torch.randperm(nblk * bs, generator=gen, device=device)[:b * t].to(torch.int32)
            kt, vt = k_new.reshape(b * t, hkv, d), v_new.reshape(b * t, hkv, d)

            def make(kp=kp, vp=vp, slots=slots, kt=kt, vt=vt):
                return lambda: attn_ops.paged_kv_cache_append(kp, vp, kt, vt, slots)

            row["impls"][f"paged{bs}"], _ = runner.timed_entry(make, device=device, args=args,
                                                               nbytes=nbytes)
        for name, e in row["impls"].items():
            reporting.note(notes, name, e, label)
        print(f"  {label}: " + ", ".join(f"{n} {bw_cell(e)}" for n, e in row["impls"].items()),
              flush=True)
        rows.append(row)
        del kc, vc, k_new, v_new
        machine.free_memory(device)
    return rows


def mixed_step(attn_ops, args, notes):
    """One continuous-batching step: --mixed-decode rows decoding 1 token, 1 row prefilling a chunk, one
    paged cache; ragged (one packed call) against padded (one dense call) and split (two calls)."""
    device, dtype, d, hq = args.device, DTYPES[args.dtype], args.head_dim, args.hq
    rows, chunk, ctx, bs = args.mixed_decode, args.mixed_prefill, args.mixed_context, 16
    label = f"mixed step {rows} x 1 + 1 x {chunk} over {ctx} cached"
    results = []
    for hkv in args.hkv:
        gen = baselines.generator(device, 3)
        batch = rows + 1
        lens = torch.tensor([ctx + 1] * rows + [ctx + chunk], dtype=torch.int32, device=device)
        max_blocks = -(-(ctx + chunk) // bs)
        table = torch.randperm(batch * max_blocks, generator=gen, device=device).to(torch.int32)
        table = table.reshape(batch, max_blocks)
        kc = baselines.randn((batch * max_blocks, bs, hkv, d), dtype, device, gen)
        vc = baselines.randn((batch * max_blocks, bs, hkv, d), dtype, device, gen)
        q_decode = baselines.randn((rows, 1, hq, d), dtype, device, gen)
        q_prefill = baselines.randn((1, chunk, hq, d), dtype, device, gen)
        q_packed = torch.cat([q_decode.flatten(0, 1), q_prefill.flatten(0, 1)])
        cu = torch.tensor([0] + list(range(1, rows + 1)) + [rows + chunk], dtype=torch.int32, device=device)
        q_padded = torch.zeros(batch, chunk, hq, d, dtype=dtype, device=device)
        q_padded[:rows, -1:] = q_decode  # the real decode query is the last (bottom-right) position
        q_padded[rows] = q_prefill[0]
        kw = dict(block_table=table)
        calls = {
            "ragged": lambda: attn_ops.attention_with_kvcache(q_packed, kc, vc, lens, cu_seqlens_q=cu,
                                                              max_seqlen_q=chunk, **kw)[0],
            "padded": lambda: attn_ops.attention_with_kvcache(q_padded, kc, vc, lens, **kw)[0],
            "split": lambda: (attn_ops.attention_with_kvcache(q_decode, kc, vc, lens[:rows],
                                                              block_table=table[:rows])[0],
                              attn_ops.attention_with_kvcache(q_prefill, kc, vc, lens[rows:],
                                                              block_table=table[rows:])[0]),
        }
        cache_bytes = 2 * (rows * (ctx + 1) + ctx + chunk) * hkv * d * kc.element_size()
        row = {"Hkv": hkv, "decode_rows": rows, "chunk": chunk, "context": ctx, "impls": {}, "rel_diff": {}}
        outs = {}
        for name, call in calls.items():
            row["impls"][name], outs[name] = runner.timed_entry(lambda call=call: call, device=device, args=args,
                                                                nbytes=cache_bytes)
            reporting.note(notes, name, row["impls"][name], label)
        real = {  # [rows + chunk, Hq, D]: the outputs of the real queries, in packed order
            "ragged": outs["ragged"],
            "padded": None if outs["padded"] is None else torch.cat([outs["padded"][:rows, -1],
                                                                     outs["padded"][rows]]),
            "split": None if outs["split"] is None else torch.cat([outs["split"][0].flatten(0, 1),
                                                                   outs["split"][1][0]]),
        }
        for name in ("padded", "split"):
            if real[name] is not None and real["ragged"] is not None:
                row["rel_diff"][name] = baselines.rel_maxdiff(real[name], real["ragged"])
        print(f"  {label} Hkv={hkv}: " + ", ".join(f"{n} {bw_cell(e)}" for n, e in row["impls"].items()) +
              ", " + ", ".join(f"{n}/ragged {reporting.time_ratio(row['impls'], n, 'ragged')}"
                               for n in ("padded", "split")), flush=True)
        results.append(row)
        machine.free_memory(device)
    return results


def mixed_markdown(args, mixed):
    L = ["", f"Mixed serving step: {args.mixed_decode} rows decoding 1 token over {args.mixed_context} cached "
         f"keys + 1 row prefilling {args.mixed_prefill} tokens (after {args.mixed_context} cached keys), one paged "
         f"cache (block size 16), Hq = {args.hq}, D = {args.head_dim}, {args.dtype}. ragged = one call with "
         f"packed q and cu_seqlens_q; padded = one dense call with every row padded to {args.mixed_prefill} "
         f"queries; split = one call for the decode rows + one for the prefill row. Cells: median time "
         f"(GB/s of K/V read); X/ragged = X time / ragged time (> 1: ragged is faster). rel. diff: max abs "
         f"difference of the real queries' outputs against ragged / max abs(ragged).", ""]
    rows = [[str(r["Hkv"])] + [bw_cell(r["impls"].get(n)) for n in ("ragged", "padded", "split")] +
            [reporting.time_ratio(r["impls"], n, "ragged") for n in ("padded", "split")] +
            [", ".join(f"{n} {v:.1e}" for n, v in r["rel_diff"].items())] for r in mixed]
    L.append(reporting.markdown_table(["Hkv", "ragged", "padded", "split", "padded/ragged", "split/ragged",
                                    "rel. diff"], rows))
    return L


def render_markdown(run, results, bulk, mixed=()):
    args, cp = run.args, run.ceilings["copy"]["gbps"]
    L = ["# attn_ops decode benchmark (attention_with_kvcache, KV-cache appends)", ""]
    L += reporting.header_lines(run.info, run.ceilings, run.elapsed(), args.device)
    rd = run.ceilings["read"]
    L.append(f"- read ceiling (this run): sum of {reporting.fmt_bytes(rd['bytes'])}: {rd['gbps']:.1f} GB/s "
             f"(bytes read; what decode needs: it only reads the cache)")
    L.append("")
    if results:
        L.append(f"Decode: one query token per row, Hq = {args.hq}, D = {args.head_dim}, {args.dtype}, "
                 f"every row attends to the whole context. Cells: median time (GB/s of the K/V cache "
                 f"read). X/ours = X time / ours time (> 1: attn_ops is faster), against ours on the "
                 f"contiguous cache. ours % copy = ours' GB/s / the copy bandwidth measured above "
                 f"({cp:.0f} GB/s); ours % read = the same against the read bandwidth "
                 f"({run.ceilings['read']['gbps']:.0f} GB/s). ours[graph] = the same call replayed from a CUDA "
                 f"graph (no host work). ours[huge] = ours over a copy of the cache in transparent huge pages (a "
                 f"BSHD cache in huge pages). ours[nn] = ours over attn_ops.nn.KVCache's storage holding the same "
                 f"values (CPU: [B, Hkv, T, D] in huge pages, as transposed views). ours[bhtd] = ours over the "
                 f"baselines' [B, Hkv, T, D] cache (HF's layout) passed as a transposed view, read in place. "
                 f"ours[dense] = attn_ops.attention (the dense op) on those views, as transformers' generation "
                 f"calls it. paged16 / paged1 = ours over a paged cache with that block size (paged16[nn]: in "
                 f"attn_ops.nn.PagedKVCache's storage). The baselines read a contiguous [B, Hkv, T, D] cache. rel. "
                 f"diff: max abs(ours - sdpa) / max abs(sdpa); paged diff: the largest of the same for paged, "
                 f"ours[huge], ours[nn], ours[bhtd] and ours[dense] against contiguous. Times are device times from "
                 f"CUDA events with the L2 flushed before each call (see the script's docstring).")
        L.append("")
        keys = [("B", lambda r: r["B"]), ("context", lambda r: r["context"]), ("Hkv", lambda r: r["Hkv"]),
                ("cache", lambda r: reporting.fmt_bytes(r["cache_bytes"]))]
        L += reporting.bandwidth_tables(
            results, keys, args.impls, cp,
            [("rel. diff", "rel_diff_vs_sdpa"), ("paged diff", "rel_diff_paged_vs_contiguous")],
            "Decode appends (one new token per row, K and V): median time (GB/s, bytes read + "
            "written); latency-bound at these sizes.", read_gbps=run.ceilings["read"]["gbps"])
    if bulk:
        L.append("")
        L.append(f"Bulk appends (a prefill chunk): median time (GB/s, bytes read + written; copy "
                 f"bandwidth {cp:.0f} GB/s). paged: slots in random order over the pool.")
        L.append("")
        names = list(bulk[0]["impls"])
        rows = [[r["B"], r["Tnew"], r["Hkv"], reporting.fmt_bytes(r["bytes"] / 2)] +
                [bw_cell(r["impls"].get(n)) for n in names] for r in bulk]
        L.append(reporting.markdown_table(["B", "Tnew", "Hkv", "new K+V"] + names,
                                       [[str(c) for c in x] for x in rows]))
    if mixed:
        L += mixed_markdown(args, mixed)
    L += reporting.skipped_lines(run.notes)
    return "\n".join(L)


def main(argv=None) -> int:
    args = parse_args(argv)
    run = runner.Run(args, [args.dtype])
    run.ceilings["read"] = machine.read_ceiling(args.device)
    print(f"# ceiling: read {reporting.fmt_bytes(run.ceilings['read']['bytes'])}: "
          f"{run.ceilings['read']['gbps']:.1f} GB/s", flush=True)
    results, bulk, mixed = [], [], []

    def report(final):
        return run.write(render_markdown(run, results, bulk, mixed),
                         {"decode": results, "bulk_appends": bulk, "mixed_step": mixed}, final)

    if not run.over_budget("mixed step", "mixed step"):
        mixed += mixed_step(run.attn_ops, args, run.notes)
        report(final=False)
    if args.mixed_only:
        report(final=True)
        return 0
    cases = [(b, ctx, hkv) for hkv in args.hkv for ctx in sorted(args.context)
             for b in sorted(args.batch)]
    for ci, (b, ctx, hkv), label in run.each(cases, "decode B={} context={} Hkv={}".format):
        row = decode_case(run.attn_ops, args, b, ctx, hkv, args.seed + ci, label, run.notes,
                          run.budget)
        results.append(row)
        print(reporting.bw_line(label, row, args.impls, "rel_diff_vs_sdpa", "rel.diff"), flush=True)
        report(final=False)
    if args.append_tokens > 0 and not run.over_budget("bulk appends", "bulk appends"):
        bulk += bulk_appends(run.attn_ops, args, run.notes)
    report(final=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
