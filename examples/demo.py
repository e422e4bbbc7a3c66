"""attn_ops demo: greedy generation with a small decoder-only transformer built on attn_ops.nn.

The model (seeded random weights, Llama layout): token embedding, N layers of
[RMSNorm -> GroupedQueryAttention (RoPE) -> residual -> RMSNorm -> SwiGLU MLP -> residual],
final RMSNorm, lm_head. A batch of prompts of different lengths is right-padded, prefilled, the cache
truncated to each prompt's length, and tokens are generated greedily three ways, same weights:

  attn_ops KVCache       GroupedQueryAttention + contiguous KVCache (rotary_embedding_ in place,
                         kv_cache_append, attention_with_kvcache)
  attn_ops PagedKVCache  the same over the paged cache (block allocator, paged_kv_cache_append)
  plain PyTorch          no custom op: HF-style rotate_half RoPE, a torch-tensor KV cache [B, Hkv, S, D]
                         and F.scaled_dot_product_attention(enable_gqa=True) with an explicit mask

The first generates freely; the other two are fed its tokens and their own greedy choice is checked
at every step (so "all steps agree" means they would have generated the very same tokens). float32
must agree exactly; in bfloat16 a disagreement is accepted only as a near-tie (the two top logits closer
than twice that step's logit difference between the runs). Exits 1 on a mismatch.
Then one line each compares the attention ops alone with SDPA (prefill and decode shapes).

    python examples/demo.py                       # float32, CPU, < 1 minute on 2 cores
    python examples/demo.py --dtype bfloat16
    python examples/demo.py --device cuda --batch 16 --prompt-len 512 --new-tokens 256
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # in-place build
import attn_ops  # noqa: E402
from attn_ops.nn import GroupedQueryAttention, KVCache, PagedKVCache  # noqa: E402


# --------------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, dim, heads, kv_heads, hidden, sliding_window, max_pos):
        super().__init__()
        self.input_layernorm = RMSNorm(dim)
        self.self_attn = GroupedQueryAttention(dim, heads, kv_heads, sliding_window=sliding_window,
                                               max_position_embeddings=max_pos)
        self.post_attention_layernorm = RMSNorm(dim)
        self.mlp = SwiGLU(dim, hidden)


class DecoderLM(nn.Module):
    def __init__(self, vocab, dim, layers, heads, kv_heads, hidden, sliding_window=None,
                 max_pos=4096):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, kv_heads, hidden, sliding_window, max_pos)
                                    for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens, attend):
        """Final hidden states [B, T, dim]; attend(layer_idx, attn_module, x) runs the attention."""
        x = self.embed_tokens(tokens)
        for i, blk in enumerate(self.layers):
            x = x + attend(i, blk.self_attn, blk.input_layernorm(x))
            x = x + blk.mlp(blk.post_attention_layernorm(x))
        return self.norm(x)


# --------------------------------------------------------------------------------------------------
# Plain-PyTorch attention over a torch-tensor KV cache (the baseline; no attn_ops op)
# --------------------------------------------------------------------------------------------------
def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class TorchKVCache:
    """Per layer k/v [B, Hkv, capacity, D] (HF layout); per-row lengths; explicit masks."""

    def __init__(self, num_layers, B, capacity, Hkv, D, dtype, device):
        self.k = [torch.zeros(B, Hkv, capacity, D, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros_like(t) for t in self.k]
        self.lengths = torch.zeros(B, dtype=torch.long, device=device)
        self.max_len = 0          # host-side max of lengths, for slicing
        self.num_layers = num_layers

    def attend(self, layer, m: GroupedQueryAttention, x):
        B, T, _ = x.shape
        H, Hkv, D = m.num_heads, m.num_kv_heads, m.head_dim
        q = m.q_proj(x).view(B, T, H, D).transpose(1, 2)
        k = m.k_proj(x).view(B, T, Hkv, D).transpose(1, 2)
        v = m.v_proj(x).view(B, T, Hkv, D).transpose(1, 2)
        pos = self.lengths[:, None] + torch.arange(T, device=x.device)        # [B, T]
        cos = torch.cat([m.rope_cos[pos]] * 2, -1).unsqueeze(1).to(x.dtype)    # HF: cast to dtype
        sin = torch.cat([m.rope_sin[pos]] * 2, -1).unsqueeze(1).to(x.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if T > 1:   # prefill into empty rows (right-padded prompts)
            self.k[layer][:, :, :T] = k
            self.v[layer][:, :, :T] = v
        else:       # one token per row, at each row's own length
            rows = torch.arange(B, device=x.device)
            self.k[layer][rows, :, self.lengths] = k[:, :, 0]
            self.v[layer][rows, :, self.lengths] = v[:, :, 0]
        S = self.max_len + T
        j = torch.arange(S, device=x.device)
        visible = (j <= pos[:, :, None]) & (j < (self.lengths + T)[:, None, None])  # [B, T, S]
        if m.sliding_window is not None:
            visible &= j > pos[:, :, None] - m.sliding_window
        out = F.scaled_dot_product_attention(q, self.k[layer][:, :, :S], self.v[layer][:, :, :S],
                                             attn_mask=visible[:, None], enable_gqa=True)
        if layer == self.num_layers - 1:
            self.lengths += T
            self.max_len += T
        return m.o_proj(out.transpose(1, 2).reshape(B, T, H * D))

    def truncate(self, lens):
        self.lengths.copy_(lens)
        self.max_len = int(lens.max())

    @property
    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


# --------------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------------
def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def generate(model, kind, prompts, lens, new_tokens, args, feed=None):
    """Greedy generation. Returns (tokens [B, new_tokens] it fed, its own argmax per step,
    logits per step [new_tokens, B, V] (float32), prefill s, decode s, cache bytes).
    feed: tokens [B, new_tokens] to feed instead of its own choices (teacher forcing)."""
    B, P = prompts.shape
    dev, dtype = prompts.device, model.lm_head.weight.dtype
    cfg = model.layers[0].self_attn
    L, Hkv, D = len(model.layers), cfg.num_kv_heads, cfg.head_dim
    cap = P + new_tokens
    if kind == "kvcache":
        cache = KVCache(L, B, cap, Hkv, D, dtype=dtype, device=dev)
    elif kind == "paged":
        bs = args.block_size
        cache = PagedKVCache(L, B * -(-cap // bs), bs, Hkv, D, B, -(-cap // bs), dtype=dtype,
                             device=dev)
    else:
        cache = TorchKVCache(L, B, cap, Hkv, D, dtype, dev)
    if kind == "torch":
        attend = cache.attend
    else:
        def attend(i, m, x):
            return m(x, cache=cache, layer_idx=i)

    rows = torch.arange(B, device=dev)
    own, fed, logits_all = [], [], []

    def pick(h):
        logits = model.lm_head(h).float()
        choice = logits.argmax(-1)
        tok = choice if feed is None else feed[:, len(own)]
        own.append(choice)
        fed.append(tok)
        logits_all.append(logits)
        return tok

    with torch.no_grad():
        sync(dev.type)
        t0 = time.perf_counter()
        if kind == "paged":
            cache.reserve(P)
        h = model(prompts, attend)                 # right-padded prefill
        cache.truncate(lens)                        # drop the padding from each row
        tok = pick(h[rows, lens - 1])
        sync(dev.type)
        t1 = time.perf_counter()
        for _ in range(new_tokens - 1):
            if kind == "paged":
                cache.reserve(1)
            h = model(tok[:, None], attend)
            tok = pick(h[:, -1])
        sync(dev.type)
        t2 = time.perf_counter()
    return (torch.stack(fed, 1), torch.stack(own, 1), torch.stack(logits_all), t1 - t0, t2 - t1,
            cache.nbytes)


def compare(name, lead, other, dtype):
    """Check other's greedy choices against the tokens lead generated (and fed to other)."""
    tokens, _, lead_logits = lead[0], lead[1], lead[2]
    own, logits = other[1], other[2]
    step_err = (logits - lead_logits).abs().amax(-1)          # [steps, B]
    equal = own == tokens                                     # [B, steps]
    top = logits.amax(-1)
    chosen = logits.gather(-1, tokens.t()[..., None])[..., 0]
    margin = (top - chosen).t()                               # [B, steps], 0 where equal
    near_tie = ~equal & (margin <= 2 * step_err.t())
    ok = bool((equal | near_tie).all()) if dtype != torch.float32 else bool(equal.all())
    rel = float(step_err.max() / lead_logits.abs().max())
    n = equal.numel()
    line = (f"  {name:<30} same greedy token at {int(equal.sum())}/{n} steps"
            + (f" ({int(near_tie.sum())} near-ties)" if int(near_tie.sum()) else "")
            + f", max|logits - attn_ops KVCache| / max|logits| = {rel:.1e}  "
            + ("OK" if ok else "MISMATCH"))
    if not ok:
        b, s = (~(equal | near_tie)).nonzero()[0].tolist()
        line += (f"\n    first disagreement: row {b}, step {s}: fed {int(tokens[b, s])}, "
                 f"own choice {int(own[b, s])}, margin {float(margin[b, s]):.3g}, "
                 f"logit difference {float(step_err[s, b]):.3g}")
    print(line)
    return ok


# --------------------------------------------------------------------------------------------------
# The ops alone vs SDPA
# --------------------------------------------------------------------------------------------------
def time_ms(fn, device, repeats=3):
    fn()  # warm-up

    def once():
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        return (time.perf_counter() - t0) * 1e3

    return statistics.median(once() for _ in range(repeats))


def ops_vs_sdpa(args, dtype, Hq, Hkv, D):
    dev = args.device
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    ok = True
    # prefill: causal self-attention over T tokens
    B, T = 1, args.op_prefill_len
    q = torch.randn(B, T, Hq, D, device=dev, dtype=dtype)
    k = torch.randn(B, T, Hkv, D, device=dev, dtype=dtype)
    v = torch.randn(B, T, Hkv, D, device=dev, dtype=dtype)
    qh, kh, vh = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    ours = attn_ops.attention(q, k, v, causal=True)[0]
    ref = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True).transpose(1, 2)
    err = float((ours.float() - ref.float()).abs().max())
    ok &= err <= tol
    t_o = time_ms(lambda: attn_ops.attention(q, k, v, causal=True), dev)
    t_s = time_ms(lambda: F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True), dev)
    print(f"  {f'attention (prefill B={B} T={T})':<44} attn_ops {t_o:7.2f} ms   SDPA {t_s:7.2f} ms   "
          f"SDPA/attn_ops {t_s / t_o:5.2f}x   max|diff| {err:.1e}")
    # decode: one query per row over a long cache
    B, S = args.batch, args.op_cache_len
    q = torch.randn(B, 1, Hq, D, device=dev, dtype=dtype)
    kc = torch.randn(B, S, Hkv, D, device=dev, dtype=dtype)
    vc = torch.randn(B, S, Hkv, D, device=dev, dtype=dtype)
    sl = torch.full((B,), S, dtype=torch.int32, device=dev)
    qh, kh, vh = (x.transpose(1, 2).contiguous() for x in (q, kc, vc))
    ours = attn_ops.attention_with_kvcache(q, kc, vc, sl)[0]
    ref = F.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True).transpose(1, 2)
    err = float((ours.float() - ref.float()).abs().max())
    ok &= err <= tol
    t_o = time_ms(lambda: attn_ops.attention_with_kvcache(q, kc, vc, sl), dev)
    t_s = time_ms(lambda: F.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True), dev)
    print(f"  {f'attention_with_kvcache (decode B={B} S={S})':<44} attn_ops {t_o:7.2f} ms   SDPA {t_s:7.2f} ms   "
          f"SDPA/attn_ops {t_s / t_o:5.2f}x   max|diff| {err:.1e}")
    return ok


# --------------------------------------------------------------------------------------------------
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=128, help="longest prompt (the others shorter)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--mlp-hidden", type=int, default=1408)
    p.add_argument("--sliding-window", type=int, default=None)
    p.add_argument("--block-size", type=int, default=16, help="PagedKVCache block size")
    p.add_argument("--op-prefill-len", type=int, default=1024)
    p.add_argument("--op-cache-len", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    dev, dtype = torch.device(args.device), getattr(torch, args.dtype)
    B, P, N = args.batch, args.prompt_len, args.new_tokens

    torch.manual_seed(args.seed)
    model = DecoderLM(args.vocab, args.dim, args.layers, args.heads, args.kv_heads, args.mlp_hidden,
                      args.sliding_window, max_pos=max(4096, P + N)).to(dev, dtype).eval()
    nparams = sum(p.numel() for p in model.parameters())
    lens = torch.tensor([P - (b * 37) % max(1, P // 2) for b in range(B)], device=dev)
    prompts = torch.randint(0, args.vocab, (B, P), device=dev)
    attn = model.layers[0].self_attn
    print(f"attn_ops {attn_ops.__version__}, torch {torch.__version__}, device {args.device}, "
          f"{torch.get_num_threads()} threads, {args.dtype}")
    print(f"model: vocab {args.vocab}, dim {args.dim}, {args.layers} layers, {attn.num_heads} query heads / "
          f"{attn.num_kv_heads} KV heads (head dim {attn.head_dim}), SwiGLU {args.mlp_hidden}, "
          f"{nparams / 1e6:.1f}M parameters"
          + (f", sliding window {args.sliding_window}" if args.sliding_window else ""))
    print(f"batch {B}, prompt lengths {lens.tolist()} (right-padded to {P}), {N} new tokens per row, "
          f"greedy\n")

    # warm-up (first-call costs: thread pools, allocator)
    for kind in ("kvcache", "paged", "torch"):
        generate(model, kind, prompts[:, :8], torch.full_like(lens, 8), 3, args)

    runs = {}
    runs["kvcache"] = generate(model, "kvcache", prompts, lens, N, args)
    feed = runs["kvcache"][0]
    runs["paged"] = generate(model, "paged", prompts, lens, N, args, feed=feed)
    runs["torch"] = generate(model, "torch", prompts, lens, N, args, feed=feed)

    names = {"kvcache": "attn_ops KVCache", "paged": f"attn_ops PagedKVCache(bs={args.block_size})",
             "torch": "plain PyTorch (SDPA, no op)"}
    print(f"  {'':<32} {'prefill tok/s':>14} {'decode tok/s':>13} {'KV cache MB':>12}")
    for kind, r in runs.items():
        prefill_tps = B * P / r[3]
        decode_tps = B * (N - 1) / r[4] if N > 1 else float("nan")
        print(f"  {names[kind]:<32} {prefill_tps:14.0f} {decode_tps:13.1f} {r[5] / 2**20:12.1f}")
    t_ref, t_ours = runs["torch"][4], runs["kvcache"][4]
    print(f"  decode speed, attn_ops KVCache / plain PyTorch: {t_ref / t_ours:.2f}x\n")

    ok = compare(names["paged"], runs["kvcache"], runs["paged"], dtype)
    ok &= compare(names["torch"], runs["kvcache"], runs["torch"], dtype)
    print(f"  row 0 generated: {feed[0, :12].tolist()} ...\n")

    print("the ops alone vs F.scaled_dot_product_attention (enable_gqa=True), model head shapes:")
    ok &= ops_vs_sdpa(args, dtype, attn.num_heads, attn.num_kv_heads, attn.head_dim)

    print("\nall checks passed" if ok else "\nFAILED: attn_ops disagrees with plain PyTorch")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
