"""Benchmark lightning attention (attn_ops.lightning_attention / lightning_attention_decode_) against the
paths people run today, side by side in one run (ratios within the run; absolute times on a shared machine
are noisy).

Sections (defaults: float32, H 16, D 128, MiniMax's decay rates):
  prefill      forward at B 1, T in --prefill-lens: ours vs transformers' MiniMax block loop (256-token
               blocks, the loop of MiniMaxLightningAttention.forward on the attention tensors) vs the same
               chunked algorithm in plain PyTorch (all blocks batched, a scan over the block states) under
               torch.compile, at blocks 64 and 256 (the faster is reported).
  train        forward + backward at B 1, T 4096: ours (C++ autograd) vs autograd through the compiled
               chunked baseline.
  decode       one token for B rows (--decode-batch): our decode op on a state pool vs transformers' token
               loop on the state tensors; GB/s = state bytes read + written (2 * B * H * D * D * 4) / time, next
               to the copy bandwidth measured in this run. Then the whole attention layer's decode step
               (projections included, hidden = H * D): transformers' MiniMaxLightningAttention with its cache
               vs attn_ops.nn.LightningAttention with a LinearAttentionState.
  crossover    time against T (B 1) of our lightning forward and of our softmax `attention` op (causal, same
               H and D): the length where linear overtakes softmax; a PNG plot (--plot).
  generate     greedy generate() tokens/s of a small random MiniMaxForCausalLM, eager vs swapped
               (swap_minimax_attention + attn_implementation="attn_ops"), with the same-tokens check.

Example (the committed CPU results):
  python benchmarks/bench_lightning.py --out benchmarks/results/xeon_lightning.md \\
      --plot benchmarks/results/xeon_lightning_crossover.png
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import baselines  # noqa: E402
import cli  # noqa: E402
import machine  # noqa: E402
import reporting  # noqa: E402
import timing  # noqa: E402

attn_ops = machine.import_attn_ops()
from attn_ops.integrations import transformers as hf  # noqa: E402
from attn_ops.integrations.minimax import swap_minimax_attention  # noqa: E402
from attn_ops.nn.lightning import LightningAttention, LinearAttentionState, minimax_slope_rate  # noqa: E402


# ----------------------------------------------------------------------------------------- baselines
def hf_block_loop(q, k, v, slope, block=256):
    """transformers' MiniMax prefill loop on [B, H, T, D] tensors (its decay tables, its matmuls)."""
    B, H, T, D = q.shape
    rate = slope[:, None, None]
    r = torch.arange(block) + 1
    q_decay, k_decay = torch.exp(-rate * r[:, None]), torch.exp(-rate * (block - r[:, None]))
    diag = rate * (r[:, None] - r[None, :])
    diag = torch.exp(torch.where(diag >= 0, -diag, float("-inf")))[None]
    state = torch.zeros(B, H, D, v.shape[-1])
    outs = []
    for start in range(0, T, block):
        end = min(start + block, T)
        c = end - start
        qb, kb, vb = q[:, :, start:end], k[:, :, start:end], v[:, :, start:end]
        intra = torch.matmul(torch.matmul(qb, kb.transpose(-1, -2)) * diag[:, :, :c, :c], vb)
        inter = torch.matmul(qb * q_decay[:, :c], state)
        outs.append(intra + inter)
        state = state * torch.exp(-rate * c) + torch.matmul((kb * k_decay[:, -c:]).transpose(-1, -2), vb)
    return torch.cat(outs, -2), state


def hf_token_loop(q, k, v, state, slope):
    """transformers' MiniMax decode step: ratio * S + k^T v, then q S ([B, H, 1, D] tensors)."""
    state = torch.exp(-slope)[:, None, None] * state + torch.matmul(k.transpose(-1, -2), v)
    return torch.matmul(q, state), state


def chunked_torch(q, k, v, slope, block):
    """The chunked algorithm in plain PyTorch, all blocks at once: q/k/v [B, H, T, D], T % block == 0."""
    B, H, T, D = q.shape
    n = T // block
    qb, kb, vb = (x.reshape(B, H, n, block, x.shape[-1]) for x in (q, k, v))
    i = torch.arange(block, dtype=torch.float32)
    s = slope[:, None]  # [H, 1]
    age = i[:, None] - i[None, :]
    mask = torch.where(age >= 0, torch.exp(-s[:, :, None] * age), 0.0).view(1, H, 1, block, block)
    q_decay = torch.exp(-s * (i + 1)).view(1, H, 1, block, 1)
    k_decay = torch.exp(-s * (block - 1 - i)).view(1, H, 1, block, 1)
    intra = torch.matmul(torch.matmul(qb, kb.transpose(-1, -2)) * mask, vb)
    kv = torch.matmul((kb * k_decay).transpose(-1, -2), vb)  # [B, H, n, D, Dv]
    decay = torch.exp(-slope * block).view(1, H, 1, 1)
    states = [torch.zeros_like(kv[:, :, 0])]
    for j in range(n - 1):
        states.append(states[-1] * decay + kv[:, :, j])
    inter = torch.matmul(qb * q_decay, torch.stack(states, 2))
    return (intra + inter).reshape(B, H, T, -1)


# ------------------------------------------------------------------------------------------- helpers
class Run:
    def __init__(self, args):
        self.args = args
        self.t0 = time.perf_counter()
        self.info = machine.machine_info("cpu")
        self.info["attn_ops"] = attn_ops.__version__
        self.ceilings = machine.measure_ceilings("cpu", ["float32"])
        self.sections = []
        self.payload = {"info": self.info, "ceilings": self.ceilings, "sections": {}}

    def time(self, fn, repeats=None):
        m = timing.measure(fn, device="cpu", repeats=repeats or self.args.repeats, warmup=self.args.warmup,
                           budget_s=self.args.budget)
        return m["median_s"]

    def interleaved(self, fns, repeats):
        """Median times of fns called in turn: a load spike on the shared machine hits all of them."""
        for fn in fns:
            fn()
        samples = [[] for _ in fns]
        for _ in range(repeats):
            for fn, out in zip(fns, samples):
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
        return [sorted(x)[len(x) // 2] for x in samples]

    def add(self, title, text, rows):
        self.sections.append(f"## {title}\n\n{text}\n\n" + reporting.markdown_table(rows[0], rows[1:]))
        self.payload["sections"][title] = rows
        print(self.sections[-1], flush=True)

    def elapsed(self):
        return time.perf_counter() - self.t0


def inputs(B, T, H, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, T, H, D, generator=g) * 0.1 for _ in range(3)]


def ms(t):
    return f"{t * 1e3:.2f}"


# ------------------------------------------------------------------------------------------ sections
def prefill(run, H, D, slope):
    rows = [["T", "ours ms", "transformers loop ms", "compiled chunked ms (block)", "vs transformers",
             "vs compiled", "max rel diff"]]
    for T in run.args.prefill_lens:
        q, k, v = inputs(1, T, H, D)
        qh, kh, vh = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        ours = run.time(lambda: attn_ops.lightning_attention(q, k, v, slope))
        loop = run.time(lambda: hf_block_loop(qh, kh, vh, slope))
        best = None
        for block in (64, 256):
            fn = torch.compile(lambda a, b, c, blk=block: chunked_torch(a, b, c, slope, blk), dynamic=False)
            fn(qh, kh, vh)
            t = run.time(lambda: fn(qh, kh, vh))
            best = min(best or (t, block), (t, block))
        out = attn_ops.lightning_attention(q, k, v, slope)[0].transpose(1, 2)
        diff = baselines.rel_maxdiff(out, hf_block_loop(qh, kh, vh, slope)[0])
        rows.append([T, ms(ours), ms(loop), f"{ms(best[0])} ({best[1]})", f"{loop / ours:.2f}x",
                     f"{best[0] / ours:.2f}x", f"{diff:.1e}"])
    run.add("Prefill forward (B 1, float32)", "Ratios are baseline time / ours (> 1: ours faster).", rows)


def train(run, H, D, slope, T=4096):
    q, k, v = (x.requires_grad_() for x in inputs(1, T, H, D))
    g = torch.randn(1, T, H, D)

    def ours():
        out, _ = attn_ops.lightning_attention(q, k, v, slope)
        return torch.autograd.grad(out, (q, k, v), g)

    rows = [["baseline block", "ours fwd+bwd ms", "compiled chunked fwd+bwd ms", "ratio"]]
    t_ours = run.time(ours)
    for block in (64, 256):
        fn = torch.compile(lambda a, b, c, blk=block: chunked_torch(a, b, c, slope, blk), dynamic=False)

        def base():
            out = fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
            return torch.autograd.grad(out, (q, k, v), g)

        base()
        t = run.time(base)
        rows.append([block, ms(t_ours), ms(t), f"{t / t_ours:.2f}x"])
    run.add(f"Forward + backward (B 1, T {T}, float32)", "Gradients of q, k, v for a random output gradient; "
            "ratio = baseline / ours.", rows)


def decode(run, H, D, slope):
    B = run.args.decode_batch
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, 1, H, D, generator=g) * 0.1 for _ in range(3))
    pool = torch.randn(B, H, D, D, generator=g) * 0.01
    ref_state = pool.clone()
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    src, dst = torch.randn_like(pool), torch.empty_like(pool)
    t_ours, t_loop, t_copy = run.interleaved([lambda: attn_ops.lightning_attention_decode_(q, k, v, pool, slope),
                                              lambda: hf_token_loop(qh, kh, vh, ref_state, slope),
                                              lambda: dst.copy_(src)], 20)
    nbytes = 2 * B * H * D * D * 4
    copy = nbytes / t_copy / 1e9  # a copy of one state pool, timed in turn with the two decodes
    rows = [["impl", "ms", "state GB/s", "% of copy bandwidth", "ratio"],
            ["ours (decode op, in place)", ms(t_ours), f"{nbytes / t_ours / 1e9:.1f}",
             f"{100 * nbytes / t_ours / 1e9 / copy:.0f}%", "1.00x"],
            ["transformers token loop", ms(t_loop), f"{nbytes / t_loop / 1e9:.1f}",
             f"{100 * nbytes / t_loop / 1e9 / copy:.0f}%", f"{t_loop / t_ours:.2f}x"]]
    run.add(f"Decode op (B {B}, one token, state [B, {H}, {D}, {D}] float32)",
            f"State bytes read + written per step: {nbytes / 1e6:.1f} MB. Copy bandwidth: {copy:.1f} GB/s for a "
            "copy of one state pool (the same bytes read + written), timed in turn with the two decodes, so all "
            "three see the same load. The pool does not fit the caches: each step streams it from memory.", rows)
    layer_decode(run, H, D, B)


def layer_decode(run, H, D, B, prompt=32):
    from transformers import MiniMaxConfig
    from transformers.models.minimax.modeling_minimax import MiniMaxCache
    from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention as HFLightning

    config = MiniMaxConfig(hidden_size=H * D, num_attention_heads=H, head_dim=D, num_hidden_layers=4,
                           block_size=256)
    hf_layer = HFLightning(config, 1).eval()
    ours = LightningAttention(H * D, H, D, layer_idx=1, num_layers=4).eval()
    ours.load_state_dict(hf_layer.state_dict())
    x = torch.randn(B, prompt, H * D) * 0.1
    step = torch.randn(B, 1, H * D) * 0.1
    with torch.no_grad():
        cache = MiniMaxCache()
        hf_layer(x, None, None, past_key_values=cache)
        pool = LinearAttentionState(4, B, H, D)
        slots = pool.allocate(B)
        ours(x, state=pool, state_indices=slots)
        base_state = cache.get_linear_cache(1).clone()

        def hf_step():
            cache.set_linear_cache(1, base_state)  # every timed step starts from the prompt's state
            return hf_layer(step, None, None, past_key_values=cache)[0]

        t_hf, t_ours = run.interleaved([hf_step, lambda: ours(step, state=pool, state_indices=slots)], 10)
    rows = [["impl", "ms per step", "ratio"], ["attn_ops.nn.LightningAttention", ms(t_ours), "1.00x"],
            ["transformers MiniMaxLightningAttention", ms(t_hf), f"{t_hf / t_ours:.2f}x"]]
    run.add(f"Attention layer decode step (B {B}, hidden {H * D}, float32)",
            "Projections, norm and gate included (the same weights in both); the two are timed alternately. "
            "The projections (the same matmuls in both) dominate, and they suffer most from the other "
            "engineers' load, so this ratio moves more between runs than the others.", rows)


def crossover(run, H, D, slope):
    rows = [["T", "lightning ms", "softmax attention (causal) ms", "softmax / lightning"]]
    lin, soft = [], []
    for T in run.args.crossover_lens:
        q, k, v = inputs(1, T, H, D)
        reps = 3 if T <= 4096 else 1
        t_l = run.time(lambda: attn_ops.lightning_attention(q, k, v, slope), repeats=reps)
        t_s = run.time(lambda: attn_ops.attention(q, k, v, causal=True), repeats=reps)
        lin.append((T, t_l))
        soft.append((T, t_s))
        rows.append([T, ms(t_l), ms(t_s), f"{t_s / t_l:.2f}x"])
    text = "Our two ops on the same q, k, v [1, T, H, D]."
    if run.args.plot:
        import png_plot

        png_plot.plot_loglog(run.args.plot, [soft, lin])
        text += (f" Plot: `{run.args.plot.split('/')[-1]}`, time against T on log-log axes (grid: each doubling "
                 "of T, each 10x of time); blue = softmax attention, red = lightning attention.")
    run.add(f"Lightning vs softmax attention against T (B 1, H {H}, D {D}, float32)", text, rows)


def generate(run):
    from transformers import MiniMaxConfig, MiniMaxForCausalLM

    hf.register()
    config = MiniMaxConfig(vocab_size=1000, hidden_size=256, intermediate_size=512, num_attention_heads=8,
                           num_key_value_heads=2, head_dim=32, num_hidden_layers=4, num_local_experts=4,
                           num_experts_per_tok=2, block_size=256, pad_token_id=0, max_position_embeddings=4096)
    torch.manual_seed(0)
    eager = MiniMaxForCausalLM(config).eval()
    ours = copy.deepcopy(eager)
    ours.set_attn_implementation("attn_ops")
    swap_minimax_attention(ours)
    ids = torch.randint(3, 1000, (4, 256))
    kw = dict(max_new_tokens=64, min_new_tokens=64, do_sample=False)
    results = {}
    with torch.no_grad():
        for name, model in (("eager", eager), ("attn_ops", ours)):
            model.generate(ids[:, :16], max_new_tokens=2)
            t0 = time.perf_counter()
            results[name] = (model.generate(ids, **kw), time.perf_counter() - t0)
    same = torch.equal(results["eager"][0], results["attn_ops"][0])
    n = 4 * 64
    rows = [["model", "s", "tokens/s", "same tokens as eager"],
            ["eager (transformers)", f"{results['eager'][1]:.2f}", f"{n / results['eager'][1]:.1f}", "-"],
            ["attn_ops (swap)", f"{results['attn_ops'][1]:.2f}", f"{n / results['attn_ops'][1]:.1f}",
             "yes" if same else "NO"]]
    run.add("Tiny MiniMax generate (4 prompts x 256 tokens, 64 new, greedy, float32)",
            "A random MiniMaxForCausalLM (hidden 256, 8 heads of 32, 4 layers: 2 lightning + 2 softmax, 4 experts); "
            "time includes prefill, MoE and sampling, one run each.", rows)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_common_args(p)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--prefill-lens", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--decode-batch", type=int, default=32)
    p.add_argument("--crossover-lens", type=int, nargs="+",
                   default=[64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768])
    p.add_argument("--sections", nargs="+", default=["prefill", "train", "decode", "crossover", "generate"])
    p.add_argument("--plot", help="write the crossover PNG here")
    args = p.parse_args()
    cli.finish_common_args(p, args)
    torch.manual_seed(args.seed)
    run = Run(args)
    H, D = args.heads, args.head_dim
    slope = minimax_slope_rate(H, 1, 80).float()  # MiniMax-Text-01 has 80 layers
    table = {"prefill": lambda: prefill(run, H, D, slope), "train": lambda: train(run, H, D, slope),
             "decode": lambda: decode(run, H, D, slope), "crossover": lambda: crossover(run, H, D, slope),
             "generate": lambda: generate(run)}
    for name in args.sections:
        table[name]()
        report(run, final=False)
    report(run, final=True)


def report(run, final):
    lines = ["# Lightning attention on CPU", ""]
    lines += reporting.header_lines(run.info, run.ceilings, run.elapsed(), "cpu")
    lines += ["- The machine is shared with other engineers while this runs: absolute times are noisy; compare the "
              "ratios within one table (each row's implementations ran back to back).", ""]
    reporting.write_outputs(run.args, "\n".join(lines) + "\n" + "\n\n".join(run.sections), run.payload, final=final)


if __name__ == "__main__":
    main()
