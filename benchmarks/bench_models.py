"""Greedy generation with HuggingFace transformers models: attn_ops against transformers' own
attention ("sdpa", "eager"), prefill and decode measured separately, in one run.

Models: small randomly initialised transformers models built from configs (nothing is downloaded),
the same seeded weights for every implementation of a model:
  llama        LlamaForCausalLM, GQA: 4 layers, hidden 1024, 16 heads / 4 KV heads (head dim 64),
               intermediate 2816, vocab 32000 (~111 M parameters)
  mistral      MistralForCausalLM, the same shape with sliding_window 256 (smaller than the
               default prompt, so the window is in effect)
  qwen2        Qwen2ForCausalLM, the same shape (q/k/v projections with bias), full attention
  deepseek_v3  DeepseekV3ForCausalLM, MLA: 4 layers, hidden 1024, 16 heads, q_lora_rank 384,
               kv_lora_rank 256, qk_nope_head_dim 64, qk_rope_head_dim 32, v_head_dim 64; every
               layer dense (first_k_dense_replace = 4, intermediate 2816: no MoE, so the MLPs
               match the other models and attention is the only difference)

Implementations:
  attn_ops  llama / mistral / qwen2: attn_implementation="attn_ops" after
            attn_ops.integrations.transformers.register() (transformers' DynamicCache, our
            attention op over it); deepseek_v3: attn_ops.integrations.deepseek.
            swap_deepseek_attention(model) on a copy of the model (DeepseekLatentCache, absorbed
            MLA decode with attn_ops.mla_decode)
  sdpa      attn_implementation="sdpa" (torch.nn.functional.scaled_dot_product_attention)
  eager     attn_implementation="eager" (repeat_kv + matmul + softmax)

One generation run (greedy, batch B of random prompts of P tokens, no padding, an all-ones 2-D
attention_mask extended by one column per step, as generate() passes it):
  prefill  the first forward over the prompt, with a fresh cache and logits_to_keep=1 (as
           generate() does), plus the argmax of the first new token.
           tokens/s = B * P / time.
  decode   then N - 1 forwards of one token each over the cache (the N-th new token comes from the
           last one), argmax each; tokens/s = B * (N - 1) / time, ms/token = time / (N - 1).
  That is what generate(max_new_tokens=N, do_sample=False) computes (1 prefill + N - 1 decode
  forwards; EOS is ignored, so every run makes N tokens), without its logits processors and
  stopping criteria; both parts are timed with time.perf_counter, CUDA synchronized before each
  clock read (one sync per part, none per step).
Each (model, B, P) case times all implementations interleaved, in rounds: --warmup untimed warm-up
rounds (each implementation once per round), then up to --repeats rounds of one run per
implementation, the order rotated every round, starting no new round once --budget seconds are
spent on the case (at least one round); prefill and decode are the medians over an implementation's
runs. Times are wall-clock (time.perf_counter, torch.cuda.synchronize before each read on CUDA):
what a user of generate() waits, host overhead included. Interleaving (rather than
timing.measure per implementation, as bench_attention.py does for single ops) puts every
implementation under the same background load on a shared machine, where the load drifts over the
seconds one implementation's runs take.

Checks: "same tokens" compares the N generated tokens of every row with sdpa's: "yes", or the first
divergence with sdpa's top-1 / top-2 logit margin at that step (a margin near the numerical
difference between implementations means a near tie, not a bug). Random-init models have flat
output distributions, so eager vs sdpa is shown too as a control. "logits rel. diff" is
max |x - sdpa| / max |sdpa| of the prefill's last-position logits.

Ratios are baseline time / attn_ops time (> 1: attn_ops is faster), the same for prefill and decode.

Defaults: all four models, B in {1, 4}, P 512, N 32, 3 rounds (30 s budget per case); CPU float32
(a few minutes on a quiet 2-core CPU), CUDA bfloat16. The weights are built in float32 on the CPU
with the seed, then moved and cast. As every benchmark here (runner.Run): the machine, the exact
command and the measured matmul / copy ceilings head the report, which is rewritten after every
case; --time-budget skips the cases that would start after it.

Examples:
  python benchmarks/bench_models.py
  python benchmarks/bench_models.py --models llama deepseek_v3 --batch 1 --prompt-len 128 --new-tokens 8
  python benchmarks/bench_models.py --device cuda --batch 1 8 --prompt-len 2048
  python benchmarks/bench_models.py --out benchmarks/results/epyc_avx2_models.md
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import baselines  # noqa: E402
import cli  # noqa: E402
import machine  # noqa: E402
import reporting  # noqa: E402
import runner  # noqa: E402
import timing  # noqa: E402
from baselines import DTYPES  # noqa: E402

IMPLS = ["attn_ops", "sdpa", "eager"]

SHAPE = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
             num_attention_heads=16, max_position_embeddings=8192, bos_token_id=0, eos_token_id=1,
             pad_token_id=None, tie_word_embeddings=False)
MODELS = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", dict(SHAPE, num_key_value_heads=4)),
    "mistral": ("MistralForCausalLM", "MistralConfig",
                dict(SHAPE, num_key_value_heads=4, sliding_window=256)),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", dict(SHAPE, num_key_value_heads=4)),
    "deepseek_v3": ("DeepseekV3ForCausalLM", "DeepseekV3Config",
                    dict(SHAPE, num_key_value_heads=16, q_lora_rank=384, kv_lora_rank=256,
                         qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64,
                         first_k_dense_replace=4, n_routed_experts=8, num_experts_per_tok=2,
                         n_group=1, topk_group=1, moe_intermediate_size=704)),
}


# ------------------------------------------------------------------------------------- models


def build_model(name: str, seed: int, device: str, dtype: torch.dtype):
    """The randomly initialised model `name` (seeded, float32 on the CPU, then moved and cast), in
    eval mode, and {"description": one line about its shape, "parameters": count}."""
    import transformers

    model_cls, config_cls, kwargs = MODELS[name]
    c = getattr(transformers, config_cls)(**kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(c).eval()
    model.to(device=device, dtype=dtype)
    n_params = sum(p.numel() for p in model.parameters())
    desc = f"{model_cls}: {c.num_hidden_layers} layers, hidden {c.hidden_size}, {c.num_attention_heads} heads"
    if name == "deepseek_v3":
        desc += (f", MLA q_lora_rank {c.q_lora_rank}, kv_lora_rank {c.kv_lora_rank}, "
                 f"qk_nope/rope/v head dims {c.qk_nope_head_dim}/{c.qk_rope_head_dim}/{c.v_head_dim}, "
                 f"first_k_dense_replace {c.first_k_dense_replace} (all layers dense)")
    else:
        desc += f" / {c.num_key_value_heads} KV heads, head dim {c.hidden_size // c.num_attention_heads}"
    desc += f", intermediate {c.intermediate_size}, vocab {c.vocab_size}"
    if name == "mistral":
        desc += f", sliding_window {c.sliding_window}"
    if name == "qwen2":
        desc += ", q/k/v bias"
    desc += f"; {n_params / 1e6:.1f} M parameters"
    return model, {"description": desc, "parameters": n_params}


class ModelSet:
    """One model's implementations: `get(impl)` switches the shared model's attention
    implementation, or for DeepSeek's attn_ops returns a copy with swap_deepseek_attention applied
    (made once: the swap is in place and cannot be undone)."""

    def __init__(self, name: str, args):
        self.name = name
        self.base, self.meta = build_model(name, args.seed, args.device, DTYPES[args.dtype])
        self.swapped = None

    def get(self, impl: str):
        if impl == "attn_ops" and self.name.startswith("deepseek"):
            if self.swapped is None:
                from attn_ops.integrations.deepseek import swap_deepseek_attention

                model = copy.deepcopy(self.base)
                model.set_attn_implementation("sdpa")  # only decides the (unused) mask transformers builds
                self.swapped = swap_deepseek_attention(model)
            return self.swapped
        self.base.set_attn_implementation(impl)
        return self.base


# --------------------------------------------------------------------------------- generation


@torch.no_grad()
def generate_once(model, input_ids, new_tokens: int, device: str) -> dict:
    """One greedy generation run (see the module docstring): prefill and decode times, the tokens
    [B, N], each step's top-2 logits [B, N, 2] and the prefill's last-position logits [B, vocab]."""
    mask = torch.ones_like(input_ids)
    timing.sync(device)
    t0 = time.perf_counter()
    out = model(input_ids=input_ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
    logits = out.logits[:, -1]
    token = logits.argmax(-1, keepdim=True)
    timing.sync(device)
    t1 = time.perf_counter()
    prefill_logits, cache = logits, out.past_key_values
    tokens, top2 = [token], [logits.topk(2, dim=-1).values]
    ones = mask.new_ones(mask.shape[0], 1)
    for _ in range(new_tokens - 1):
        mask = torch.cat([mask, ones], dim=1)
        out = model(input_ids=token, attention_mask=mask, past_key_values=cache, use_cache=True)
        logits = out.logits[:, -1]
        token = logits.argmax(-1, keepdim=True)
        tokens.append(token)
        top2.append(logits.topk(2, dim=-1).values)
    timing.sync(device)
    t2 = time.perf_counter()
    return {"prefill_s": t1 - t0, "decode_s": t2 - t1, "tokens": torch.cat(tokens, dim=1).cpu(),
            "top2": torch.stack(top2, dim=1).float().cpu(), "prefill_logits": prefill_logits.float().cpu()}


def summarize(timed: list, batch: int, prompt_len: int, new_tokens: int) -> dict:
    """The entry of one implementation: medians of its timed runs, and the samples."""
    steps = new_tokens - 1
    prefill = statistics.median(r["prefill_s"] for r in timed)
    decode = statistics.median(r["decode_s"] for r in timed)
    entry = {"status": "ok", "n": len(timed),
             "prefill_ms": prefill * 1e3, "prefill_tok_s": batch * prompt_len / prefill,
             "prefill_samples_ms": [r["prefill_s"] * 1e3 for r in timed],
             "decode_samples_ms": [r["decode_s"] * 1e3 for r in timed]}
    if steps > 0:
        entry.update(decode_ms_per_token=decode / steps * 1e3, decode_tok_s=batch * steps / decode)
    return entry


def run_case(models: ModelSet, input_ids, args) -> tuple[dict, dict]:
    """Times every implementation on one (model, B, P) case, interleaved (see the module
    docstring). Returns ({impl: entry}, {impl: its last run}); an implementation that raises gets
    {"status": "OOM" | "error", "why"} and is dropped from the later rounds."""
    entries, runs = {}, {impl: [] for impl in args.impls}

    def once(impl):
        try:
            return generate_once(models.get(impl), input_ids, args.new_tokens, args.device)
        except Exception as e:  # noqa: BLE001  (reported under the tables)
            entries[impl] = {"status": "OOM" if runner.is_oom(e) else "error",
                             "why": f"{type(e).__name__}: {runner.first_line(e, 300)}"}
            runs.pop(impl)
            return None
        finally:
            machine.free_memory(args.device)

    def play(rnd: int) -> list:
        order = list(runs)
        order = order[rnd % len(order):] + order[:rnd % len(order)] if order else order
        return [(impl, once(impl)) for impl in order]

    for w in range(args.warmup):
        play(w)
    round_s, start = [], time.perf_counter()
    for r in range(args.repeats):
        if not runs or (round_s and time.perf_counter() - start + statistics.median(round_s) > args.budget):
            break
        t0 = time.perf_counter()
        for impl, run in play(r):
            if run is not None:
                runs[impl].append(run)
        round_s.append(time.perf_counter() - t0)
    b, plen = input_ids.shape
    for impl, timed in runs.items():
        entries[impl] = summarize(timed, b, plen, args.new_tokens)
    return entries, {impl: timed[-1] for impl, timed in runs.items()}


def compare_tokens(run: dict, ref: dict) -> dict:
    """The generated tokens of `run` against those of the reference run `ref` (sdpa's)."""
    a, r = run["tokens"], ref["tokens"]
    differ = a != r
    if not bool(differ.any()):
        return {"same": True, "text": "yes"}
    rows = differ.any(dim=1)
    first = torch.where(rows, differ.int().argmax(dim=1), a.shape[1])  # first differing step per row
    row = int(first.argmin())
    step = int(first[row])
    top = ref["top2"][row, step]
    margin = float(top[0] - top[1])
    n_rows = int(rows.sum())
    return {"same": False, "rows_differing": n_rows, "row": row, "step": step, "sdpa_margin": margin,
            "text": f"no: {n_rows}/{a.shape[0]} rows, first at token {step + 1} of row {row} "
                    f"(sdpa top-2 logit margin there {margin:.2g})"}


# ------------------------------------------------------------------------------------ the run


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_common_args(p, repeats_help="timed rounds per case, each one generation run per "
                                           "implementation (default 3)")
    p.set_defaults(budget=30.0)
    p.add_argument("--dtype", choices=sorted(DTYPES), help="default float32 (cpu), bfloat16 (cuda)")
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    p.add_argument("--prompt-len", type=int, nargs="+", default=[512])
    p.add_argument("--new-tokens", type=int, default=32,
                   help="tokens generated per row: 1 by the prefill, the others by decode steps")
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=IMPLS,
                   help="subset to run (attn_ops and sdpa always run: sdpa is the reference)")
    args = p.parse_args(argv)
    if args.repeats is None:
        args.repeats = 3
    cli.finish_common_args(p, args)
    if args.new_tokens < 1:
        p.error("--new-tokens must be >= 1")
    if min(args.batch + args.prompt_len) < 1:
        p.error("--batch and --prompt-len must be >= 1")
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    args.impls = ["attn_ops", "sdpa"] + [i for i in args.impls if i not in ("attn_ops", "sdpa")]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import transformers
    machine.import_attn_ops()  # the source tree when attn_ops is not installed
    from attn_ops.integrations.transformers import register

    run = runner.Run(args, [args.dtype])
    run.info["transformers"] = transformers.__version__
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the "tested with transformers x.y" warning is in the header
        register()
    results, models = [], {}
    current = None

    def report(final):
        run.info["loadavg_at_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
        return run.write(render_markdown(run, models, results), {"models": models, "results": results},
                         final)

    cases = [(name, b, plen) for name in args.models for b in args.batch for plen in args.prompt_len]
    for ci, (name, b, plen), label in run.each(cases, "{} B={} P={}".format):
        if current is None or current.name != name:
            current = None
            machine.free_memory(args.device)
            current = ModelSet(name, args)
            models[name] = current.meta
            print(f"# {name}: {current.meta['description']}", flush=True)
        gen = torch.Generator().manual_seed(args.seed + 1 + ci)
        ids = torch.randint(2, current.base.config.vocab_size, (b, plen), generator=gen).to(args.device)
        entries, last = run_case(current, ids, args)
        row = {"model": name, "B": b, "prompt_len": plen, "new_tokens": args.new_tokens,
               "impls": {impl: entries[impl] for impl in args.impls},
               "loadavg_after": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}
        for impl, e in row["impls"].items():
            reporting.note(run.notes, impl, e, label)
        if "sdpa" in last:
            for impl, r in last.items():
                if impl != "sdpa":
                    row["impls"][impl]["same_tokens"] = compare_tokens(r, last["sdpa"])
                    row["impls"][impl]["logits_rel_diff"] = baselines.rel_maxdiff(
                        r["prefill_logits"], last["sdpa"]["prefill_logits"])
        results.append(row)
        print(format_row_line(label, row, args.impls), flush=True)
        report(final=False)
    report(final=True)
    return 0


# ---------------------------------------------------------------------------------- reporting


def ratio(row: dict, impl: str, key: str) -> str:
    """impl's time / attn_ops' time for `key` ('> 1': attn_ops is faster), or a status."""
    a, o = row["impls"].get(impl, {}), row["impls"].get("attn_ops", {})
    if a.get("status") != "ok":
        return a.get("status", "-")
    if o.get("status") != "ok" or key not in a:
        return "-"
    return f"{a[key] / o[key]:.2f}"


def cell(entry: dict, rate_key: str, time_key: str) -> str:
    """'tokens/s (ms)' or the entry's status."""
    if not entry or entry.get("status") != "ok":
        return (entry or {}).get("status", "-")
    if rate_key not in entry:
        return "-"
    return f"{reporting.fmt_num(entry[rate_key])} ({entry[time_key]:.1f})"


def format_row_line(label: str, row: dict, impls: list) -> str:
    parts = []
    for impl in impls:
        e = row["impls"].get(impl, {})
        if e.get("status") != "ok":
            parts.append(f"{impl} {e.get('status', '-')}")
            continue
        s = f"{impl} prefill {e['prefill_tok_s']:.0f} tok/s"
        if "decode_tok_s" in e:
            s += f", decode {e['decode_tok_s']:.1f} tok/s"
        if "same_tokens" in e:
            s += f", same tokens {e['same_tokens']['text']}"
        parts.append(s)
    return f"  {label}: " + "; ".join(parts)


def render_markdown(run, models: dict, results: list) -> str:
    args, info = run.args, run.info
    impls = args.impls
    L = ["# Greedy generation with transformers models: attn_ops vs sdpa vs eager", ""]
    L += reporting.header_lines(info, run.ceilings, run.elapsed(), args.device)
    end = info.get("loadavg_at_end")
    L.append(f"- transformers {info['transformers']}; load average at the end: "
             f"{', '.join(f'{x:.2f}' for x in end) if end else 'n/a'}; \"load after\" in the prefill "
             f"table: the 1-minute load average after each case, of which this benchmark's own "
             f"{info['torch_threads']} busy threads make up to about {info['torch_threads']}")
    L.append(f"- device {args.device}, dtype {args.dtype}, {args.new_tokens} new tokens per row, "
             f"greedy, random prompts without padding, seed {args.seed}")
    L.append("")
    L.append("Models (random weights built from configs, the same weights for every implementation):")
    for name, m in models.items():
        L.append(f"- {name}: {m['description']}")
    L.append("")
    L.append("attn_ops = `attn_implementation=\"attn_ops\"` (after `attn_ops.integrations.transformers."
             "register()`; transformers' DynamicCache) for llama / mistral / qwen2, "
             "`attn_ops.integrations.deepseek.swap_deepseek_attention(model)` (DeepseekLatentCache, "
             "absorbed MLA decode) for deepseek_v3; sdpa / eager = transformers' own attention.")
    L.append("")
    steps = args.new_tokens - 1
    L.append(f"Method: one generation run = prefill (the first forward over the B x P prompt with a "
             f"fresh cache, logits_to_keep=1, + argmax) then {steps} decode forwards of one token "
             f"each over the cache (+ argmax each): what `generate(max_new_tokens={args.new_tokens}, "
             f"do_sample=False)` computes, without its logits processors. The implementations run "
             f"interleaved: {args.warmup} untimed warm-up round(s) (each implementation once), then "
             f"up to {args.repeats} rounds of one run each, the order rotated per round (no new round "
             f"once {args.budget:g} s are spent on a case); each cell is the median over the n timed "
             f"runs, wall-clock. Prefill tokens/s = B·P / prefill time; decode tokens/s = B·{steps} / "
             f"decode time. X/attn_ops = X time / attn_ops time (> 1: attn_ops is faster). "
             f"logits rel. diff: max |attn_ops - sdpa| / max |sdpa| of the prefill's last logits. "
             f"Same tokens: all B x {args.new_tokens} greedy tokens equal to sdpa's (eager: a control).")
    L.append("")
    L.append("### Prefill: tokens/s (ms)")
    L.append("")
    header = (["model", "B", "prompt"] + impls + [f"{i}/attn_ops" for i in impls if i != "attn_ops"] +
              ["logits rel. diff vs sdpa", "n", "load after"])
    rows = []
    for r in results:
        o = r["impls"].get("attn_ops", {})
        load = r.get("loadavg_after")
        rows.append([r["model"], r["B"], r["prompt_len"]] +
                    [cell(r["impls"].get(i), "prefill_tok_s", "prefill_ms") for i in impls] +
                    [ratio(r, i, "prefill_ms") for i in impls if i != "attn_ops"] +
                    [f"{o['logits_rel_diff']:.1e}" if "logits_rel_diff" in o else "-", o.get("n", "-"),
                     f"{load:.1f}" if load is not None else "-"])
    L.append(reporting.markdown_table(header, [[str(c) for c in row] for row in rows]))
    L.append("")
    L.append("### Decode: tokens/s (ms per decode step)")
    L.append("")
    header = (["model", "B", "prompt"] + impls + [f"{i}/attn_ops" for i in impls if i != "attn_ops"] +
              [f"same tokens as sdpa: {i}" for i in impls if i != "sdpa"])
    rows = []
    for r in results:
        rows.append([r["model"], r["B"], r["prompt_len"]] +
                    [cell(r["impls"].get(i), "decode_tok_s", "decode_ms_per_token") for i in impls] +
                    [ratio(r, i, "decode_ms_per_token") for i in impls if i != "attn_ops"] +
                    [r["impls"].get(i, {}).get("same_tokens", {}).get("text", "-")
                     for i in impls if i != "sdpa"])
    L.append(reporting.markdown_table(header, [[str(c) for c in row] for row in rows]))
    L += reporting.skipped_lines(run.notes)
    return "\n".join(L)


if __name__ == "__main__":
    sys.exit(main())
