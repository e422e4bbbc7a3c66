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

Then the same for a DeepSeek-style model whose layers are MultiHeadLatentAttention (MLA: low-rank query,
latent K/V of kv_lora_rank values plus one shared rotary key per token, interleaved RoPE):

  attn_ops LatentKVCache        absorbed MLA over a [c_kv ; k_pe] cache (mla_cache_append, mla_decode)
  attn_ops PagedLatentKVCache   the same over the paged latent cache
  plain PyTorch                 no custom op: HF DeepseekV3 eager style, K/V expanded per head with
                                kv_b_proj into a torch-tensor K/V cache, SDPA with an explicit mask

with the cache bytes per token of the latent cache next to those of the full K/V cache.
After each model's run (CPU), the same generation over a float8_e4m3fn cache (KVCache / LatentKVCache with
scales calibrated on the full-width run's cache): its bytes per token and decode tokens/s next to the full-width
cache's, the steps whose greedy token equals the full-width run's, and the logits' difference while they agree
(a divergence is reported, with the margin it flipped, not failed).
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
from attn_ops.nn import (GroupedQueryAttention, KVCache, LatentKVCache,  # noqa: E402
                         MultiHeadLatentAttention, PagedKVCache, PagedLatentKVCache)


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
    def __init__(self, dim, heads, kv_heads, hidden, sliding_window, max_pos, mla=None):
        super().__init__()
        self.input_layernorm = RMSNorm(dim)
        if mla is None:
            self.self_attn = GroupedQueryAttention(dim, heads, kv_heads, sliding_window=sliding_window,
                                                   max_position_embeddings=max_pos)
        else:   # mla: the MultiHeadLatentAttention dims (q_lora_rank, kv_lora_rank, head dims)
            self.self_attn = MultiHeadLatentAttention(dim, heads, max_position_embeddings=max_pos, **mla)
        self.post_attention_layernorm = RMSNorm(dim)
        self.mlp = SwiGLU(dim, hidden)


class DecoderLM(nn.Module):
    def __init__(self, vocab, dim, layers, heads, kv_heads, hidden, sliding_window=None,
                 max_pos=4096, mla=None):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, kv_heads, hidden, sliding_window, max_pos, mla)
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


def rotate_every_two(x):
    """Interleaved (DeepSeek / GPT-J) pairs (x[2i], x[2i+1]) -> (-x[2i+1], x[2i])."""
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


class TorchKVCache:
    """Per layer k/v [B, Hkv, capacity, D] (HF layout); per-row lengths; explicit masks."""

    def __init__(self, num_layers, B, capacity, Hkv, D, dtype, device, Dv=None):
        self.k = [torch.zeros(B, Hkv, capacity, D, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(B, Hkv, capacity, Dv or D, dtype=dtype, device=device)
                  for _ in range(num_layers)]
        self.lengths = torch.zeros(B, dtype=torch.long, device=device)
        self.max_len = 0          # host-side max of lengths, for slicing
        self.num_layers = num_layers

    def qkv(self, m: GroupedQueryAttention, x, pos):
        """HF Llama: q [B, H, T, D], k / v [B, Hkv, T, D], rotate_half RoPE."""
        B, T, _ = x.shape
        H, Hkv, D = m.num_heads, m.num_kv_heads, m.head_dim
        q = m.q_proj(x).view(B, T, H, D).transpose(1, 2)
        k = m.k_proj(x).view(B, T, Hkv, D).transpose(1, 2)
        v = m.v_proj(x).view(B, T, Hkv, D).transpose(1, 2)
        cos = torch.cat([m.rope_cos[pos]] * 2, -1).unsqueeze(1).to(x.dtype)    # HF: cast to dtype
        sin = torch.cat([m.rope_sin[pos]] * 2, -1).unsqueeze(1).to(x.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        return q, k, v

    def attend(self, layer, m, x):
        B, T, _ = x.shape
        pos = self.lengths[:, None] + torch.arange(T, device=x.device)        # [B, T]
        q, k, v = self.qkv(m, x, pos)
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
        window = getattr(m, "sliding_window", None)
        if window is not None:
            visible &= j > pos[:, :, None] - window
        out = F.scaled_dot_product_attention(q, self.k[layer][:, :, :S], self.v[layer][:, :, :S],
                                             attn_mask=visible[:, None], enable_gqa=True,
                                             scale=getattr(m, "softmax_scale", None))
        if layer == self.num_layers - 1:
            self.lengths += T
            self.max_len += T
        return m.o_proj(out.transpose(1, 2).reshape(B, T, -1))

    def truncate(self, lens):
        self.lengths.copy_(lens)
        self.max_len = int(lens.max())

    @property
    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    @property
    def bytes_per_token(self):
        return sum(t.shape[1] * t.shape[3] * t.element_size() for t in self.k + self.v)


class TorchMLACache(TorchKVCache):
    """HF DeepseekV3Attention (eager) over a full K/V cache: k_nope / v expanded per head with
    kv_b_proj, k_pe broadcast over the heads; k [B, H, capacity, nope + rope], v [B, H, capacity, v]."""

    def qkv(self, m: MultiHeadLatentAttention, x, pos):
        B, T, _ = x.shape
        H, nope, rope, dv = m.num_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
        q = m.q_proj(x) if m.q_lora_rank is None else m.q_b_proj(m.q_a_layernorm(m.q_a_proj(x)))
        q_nope, q_pe = q.view(B, T, H, nope + rope).transpose(1, 2).split([nope, rope], dim=-1)
        c_kv, k_pe = m.kv_a_proj_with_mqa(x).split([m.kv_lora_rank, rope], dim=-1)
        kv = m.kv_b_proj(m.kv_a_layernorm(c_kv)).view(B, T, H, nope + dv).transpose(1, 2)
        k_nope, v = kv.split([nope, dv], dim=-1)
        k_pe = k_pe.view(B, 1, T, rope)
        cos = m.rope_cos[pos].repeat_interleave(2, -1).unsqueeze(1).to(x.dtype)
        sin = m.rope_sin[pos].repeat_interleave(2, -1).unsqueeze(1).to(x.dtype)
        q_pe = q_pe * cos + rotate_every_two(q_pe) * sin
        k_pe = k_pe * cos + rotate_every_two(k_pe) * sin
        q = torch.cat((q_nope, q_pe), dim=-1)
        k = torch.cat((k_nope, k_pe.expand(B, H, T, rope)), dim=-1)
        return q, k, v


# --------------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------------
def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def generate(model, kind, prompts, lens, new_tokens, args, feed=None, scales=None):
    """Greedy generation. Returns (tokens [B, new_tokens] it fed, its own argmax per step,
    logits per step [new_tokens, B, V] (float32), prefill s, decode s, cache bytes, bytes per token, the cache).
    feed: tokens [B, new_tokens] to feed instead of its own choices (teacher forcing). Kinds ending in "_8bit"
    store the cache in float8_e4m3fn with `scales` (KVCache: (k_scale, v_scale); LatentKVCache: kv_scale)."""
    B, P = prompts.shape
    dev, dtype = prompts.device, model.lm_head.weight.dtype
    cfg = model.layers[0].self_attn
    L = len(model.layers)
    cap = P + new_tokens
    bs = args.block_size
    nb = -(-cap // bs)
    if kind == "kvcache":
        cache = KVCache(L, B, cap, cfg.num_kv_heads, cfg.head_dim, dtype=dtype, device=dev)
    elif kind == "kvcache_8bit":
        cache = KVCache(L, B, cap, cfg.num_kv_heads, cfg.head_dim, dtype=torch.float8_e4m3fn, device=dev,
                        k_scale=scales[0], v_scale=scales[1])
    elif kind == "latent_8bit":
        cache = LatentKVCache(L, B, cap, cfg.kv_lora_rank, cfg.qk_rope_head_dim, dtype=torch.float8_e4m3fn,
                              device=dev, kv_scale=scales)
    elif kind == "paged":
        cache = PagedKVCache(L, B * nb, bs, cfg.num_kv_heads, cfg.head_dim, B, nb, dtype=dtype,
                             device=dev)
    elif kind == "torch":
        cache = TorchKVCache(L, B, cap, cfg.num_kv_heads, cfg.head_dim, dtype, dev)
    elif kind == "latent":
        cache = LatentKVCache(L, B, cap, cfg.kv_lora_rank, cfg.qk_rope_head_dim, dtype=dtype, device=dev)
    elif kind == "latent_paged":
        cache = PagedLatentKVCache(L, B * nb, bs, cfg.kv_lora_rank, cfg.qk_rope_head_dim, B, nb,
                                   dtype=dtype, device=dev)
    else:   # "torch_mla"
        cache = TorchMLACache(L, B, cap, cfg.num_heads, cfg.qk_head_dim, dtype, dev, Dv=cfg.v_head_dim)
    paged = hasattr(cache, "reserve")
    if isinstance(cache, TorchKVCache):
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
        if paged:
            cache.reserve(P)
        h = model(prompts, attend)                 # right-padded prefill
        cache.truncate(lens)                        # drop the padding from each row
        tok = pick(h[rows, lens - 1])
        sync(dev.type)
        t1 = time.perf_counter()
        for _ in range(new_tokens - 1):
            if paged:
                cache.reserve(1)
            h = model(tok[:, None], attend)
            tok = pick(h[:, -1])
        sync(dev.type)
        t2 = time.perf_counter()
    return (torch.stack(fed, 1), torch.stack(own, 1), torch.stack(logits_all), t1 - t0, t2 - t1,
            cache.nbytes, cache.bytes_per_token, cache)


def compare(name, lead, other, dtype, lead_name="attn_ops KVCache"):
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
            + f", max|logits - {lead_name}| / max|logits| = {rel:.1e}  "
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
# 8-bit caches
# --------------------------------------------------------------------------------------------------
def calibrated_scale(tensors, heads_dim):
    """amax / 448 over every layer's cache (per KV head when heads_dim is given): the scale that maps the largest
    value the full-width run cached to float8_e4m3fn's largest finite value, as serving engines calibrate."""
    dims = [d for d in range(tensors[0].dim()) if d != heads_dim]
    amax = torch.stack([t.float().abs().amax(dim=dims) for t in tensors]).amax(0)
    return (amax / torch.finfo(torch.float8_e4m3fn).max).clamp_min(1e-12)


def run_8bit(model, kind, kind_8bit, label, run_16bit, prompts, lens, args, checked_steps=32):
    """Generate freely with the float8_e4m3fn cache (scales calibrated on the full-width run's cache) and report:
    cache bytes per token and decode tokens/s against the full-width cache, the steps whose greedy token equals the
    full-width run's (rows agree until they first diverge: after that their histories differ), and the logits'
    difference from the full-width run while they agree. A divergence is reported, not failed: 8-bit values carry
    3 mantissa bits."""
    cache16 = run_16bit[7]
    if kind_8bit == "kvcache_8bit":
        scales = (calibrated_scale(cache16.k, -2), calibrated_scale(cache16.v, -2))
    else:
        scales = calibrated_scale(cache16.latent, None).reshape(1)
    generate(model, kind_8bit, prompts[:, :8], torch.full_like(lens, 8), 3, args, scales=scales)  # warm-up
    r8 = generate(model, kind_8bit, prompts, lens, args.new_tokens, args, scales=scales)
    B, N = prompts.shape[0], args.new_tokens
    t16, t8 = run_16bit[4], r8[4]
    wide = str(run_16bit[7].dtype).replace("torch.", "")
    print(f"  {label}: cache {r8[6]} B/token vs {run_16bit[6]} B/token in {wide} ({run_16bit[6] / r8[6]:.1f}x "
          f"smaller), decode {B * (N - 1) / t8:.1f} tok/s vs {B * (N - 1) / t16:.1f} ({t16 / t8:.2f}x)")
    steps = min(checked_steps, N)
    same = r8[1][:, :steps] == run_16bit[0][:, :steps]                       # [B, steps]
    first_diff = [int((~row).nonzero()[0]) if not row.all() else steps for row in same]
    agree = torch.zeros(steps, B, dtype=torch.bool)
    for b, d in enumerate(first_diff):
        agree[:d, b] = True
    err = (r8[2][:steps] - run_16bit[2][:steps]).abs().amax(-1)[agree]     # logits while histories agree
    rel = float(err.max() / run_16bit[2][:steps].abs().max()) if err.numel() else float("nan")
    line = (f"    same greedy tokens as the {wide} cache for the first {steps} steps in "
            f"{sum(d == steps for d in first_diff)}/{B} rows; max|logits - {wide}| / max|logits| = {rel:.1e}")
    moved = (r8[2][:steps] - run_16bit[2][:steps]).abs().amax(-1)         # [steps, B]
    for b, d in enumerate(first_diff):
        if d < steps:
            top2 = run_16bit[2][d, b].topk(2).values
            line += (f"\n    row {b} diverges at step {d}: {wide} chose {int(run_16bit[0][b, d])}, 8-bit "
                     f"{int(r8[1][b, d])}; the {wide} run's top two logits were {float(top2[0] - top2[1]):.3g} apart, "
                     f"the 8-bit cache moved the logits by up to {float(moved[d, b]):.3g}")
    print(line)


# --------------------------------------------------------------------------------------------------
def run_generation(model, kinds, names, prompts, lens, args, dtype):
    """Warm up, generate with kinds[0], feed its tokens to the others; print the table and the checks.
    Returns (ok, runs)."""
    B, P = prompts.shape
    N = args.new_tokens
    for kind in kinds:  # warm-up (first-call costs: thread pools, allocator)
        generate(model, kind, prompts[:, :8], torch.full_like(lens, 8), 3, args)
    lead = kinds[0]
    runs = {lead: generate(model, lead, prompts, lens, N, args)}
    feed = runs[lead][0]
    for kind in kinds[1:]:
        runs[kind] = generate(model, kind, prompts, lens, N, args, feed=feed)
    print(f"  {'':<36} {'prefill tok/s':>14} {'decode tok/s':>13} {'cache MB':>9} {'cache B/token':>14}")
    for kind, r in runs.items():
        prefill_tps = B * P / r[3]
        decode_tps = B * (N - 1) / r[4] if N > 1 else float("nan")
        print(f"  {names[kind]:<36} {prefill_tps:14.0f} {decode_tps:13.1f} {r[5] / 2**20:9.1f} {r[6]:14d}")
    t_ref, t_ours = runs[kinds[-1]][4], runs[lead][4]
    print(f"  decode speed, {names[lead]} / {names[kinds[-1]]}: {t_ref / t_ours:.2f}x")
    ok = True
    for kind in kinds[1:]:
        ok &= compare(names[kind], runs[lead], runs[kind], dtype, lead_name=names[lead])
    print(f"  row 0 generated: {feed[0, :12].tolist()} ...\n")
    return ok, runs


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
    p.add_argument("--block-size", type=int, default=16, help="paged caches' block size")
    p.add_argument("--mla-q-lora-rank", type=int, default=192, help="MLA model: 0 for no q compression")
    p.add_argument("--mla-kv-lora-rank", type=int, default=128)
    p.add_argument("--mla-nope-dim", type=int, default=32)
    p.add_argument("--mla-rope-dim", type=int, default=16)
    p.add_argument("--mla-v-dim", type=int, default=32)
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
    print(f"batch {B}, prompt lengths {lens.tolist()} (right-padded to {P}), {N} new tokens per row, "
          f"greedy\n")
    print(f"GQA model: vocab {args.vocab}, dim {args.dim}, {args.layers} layers, {attn.num_heads} query heads / "
          f"{attn.num_kv_heads} KV heads (head dim {attn.head_dim}), SwiGLU {args.mlp_hidden}, "
          f"{nparams / 1e6:.1f}M parameters"
          + (f", sliding window {args.sliding_window}" if args.sliding_window else ""))
    names = {"kvcache": "attn_ops KVCache", "paged": f"attn_ops PagedKVCache(bs={args.block_size})",
             "torch": "plain PyTorch (SDPA, no op)"}
    ok, runs = run_generation(model, ["kvcache", "paged", "torch"], names, prompts, lens, args, dtype)
    if args.device == "cpu":  # 8-bit caches run on the CPU only so far
        run_8bit(model, "kvcache", "kvcache_8bit", "attn_ops KVCache(float8_e4m3fn)", runs["kvcache"], prompts,
                 lens, args)
        print()

    # ---- the MLA (DeepSeek-style) model: same skeleton, MultiHeadLatentAttention layers ----------
    mla = dict(q_lora_rank=args.mla_q_lora_rank or None, kv_lora_rank=args.mla_kv_lora_rank,
               qk_nope_head_dim=args.mla_nope_dim, qk_rope_head_dim=args.mla_rope_dim,
               v_head_dim=args.mla_v_dim)
    torch.manual_seed(args.seed + 1)
    mla_model = DecoderLM(args.vocab, args.dim, args.layers, args.heads, None, args.mlp_hidden,
                          max_pos=max(4096, P + N), mla=mla).to(dev, dtype).eval()
    m = mla_model.layers[0].self_attn
    nparams = sum(p.numel() for p in mla_model.parameters())
    print(f"MLA model: vocab {args.vocab}, dim {args.dim}, {args.layers} layers, {m.num_heads} heads, "
          f"q_lora_rank {m.q_lora_rank}, kv_lora_rank {m.kv_lora_rank}, head dims nope {m.qk_nope_head_dim} "
          f"+ rope {m.qk_rope_head_dim} / v {m.v_head_dim}, SwiGLU {args.mlp_hidden}, "
          f"{nparams / 1e6:.1f}M parameters")
    names = {"latent": "attn_ops LatentKVCache (absorbed)",
             "latent_paged": f"attn_ops PagedLatentKVCache(bs={args.block_size})",
             "torch_mla": "plain PyTorch (expanded K/V, SDPA)"}
    mla_ok, runs = run_generation(mla_model, ["latent", "latent_paged", "torch_mla"], names, prompts,
                                  lens, args, dtype)
    ok &= mla_ok
    if args.device == "cpu":
        run_8bit(mla_model, "latent", "latent_8bit", "attn_ops LatentKVCache(float8_e4m3fn)", runs["latent"],
                 prompts, lens, args)
    latent_bpt, full_bpt = runs["latent"][6], runs["torch_mla"][6]
    el = torch.finfo(dtype).bits // 8
    print(f"  cache per token: latent {latent_bpt} B ({args.layers} layers x (kv_lora_rank {m.kv_lora_rank} + "
          f"rope {m.qk_rope_head_dim}) x {el} B) vs full K/V {full_bpt} B ({args.layers} x {m.num_heads} heads "
          f"x ({m.qk_head_dim} + {m.v_head_dim}) x {el} B): {full_bpt / latent_bpt:.1f}x smaller\n")

    import lightning_demo  # the MiniMax-style section: linear attention decoding from a fixed-size state

    ok &= lightning_demo.run(dev, dtype)

    print("the ops alone vs F.scaled_dot_product_attention (enable_gqa=True), GQA model head shapes:")
    ok &= ops_vs_sdpa(args, dtype, attn.num_heads, attn.num_kv_heads, attn.head_dim)

    print("\nall checks passed" if ok else "\nFAILED: attn_ops disagrees with plain PyTorch")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
