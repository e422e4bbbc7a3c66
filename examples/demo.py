"""attn_ops demo: grouped-query attention (GQA) with attn_ops.attention, checked against PyTorch.

Runs a Llama-style GQA shape (B=1, T=2048, 32 query heads sharing 8 KV heads, head dim 128, causal)
in float32 and bfloat16, compares the output with torch.nn.functional.scaled_dot_product_attention
(enable_gqa=True), checks the returned log-sum-exp on a few heads, and times both forwards.
Exits with status 1 if attn_ops disagrees with PyTorch beyond tolerance.

    python examples/demo.py                 # CPU, < 1 minute on 2 cores
    python examples/demo.py --device cuda --seqlen 8192
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # in-place build
import attn_ops  # noqa: E402

# |ours - sdpa| <= atol + rtol * |sdpa|, elementwise. Both sides round their output to the dtype
# once, so bfloat16 allows about one bfloat16 ulp of difference.
TOL = {torch.float32: (1e-5, 1e-4), torch.bfloat16: (1e-2, 2e-2), torch.float16: (1e-3, 2e-3)}


def time_ms(fn, device, repeats=3):
    """Median of `repeats` calls; the caller has already run fn once (that is the warm-up)."""
    def once():
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3

    return statistics.median(once() for _ in range(repeats))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seqlen", type=int, default=2048)
    p.add_argument("--hq", type=int, default=32)
    p.add_argument("--hkv", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", action="append", choices=["float32", "bfloat16", "float16"],
                   help="repeatable; default float32 and bfloat16")
    args = p.parse_args()
    device, B, T, Hq, Hkv, D = args.device, args.batch, args.seqlen, args.hq, args.hkv, args.head_dim
    dtypes = [getattr(torch, d) for d in (args.dtype or ["float32", "bfloat16"])]

    print(f"attn_ops {attn_ops.__version__}, torch {torch.__version__}, device {device}, "
          f"{torch.get_num_threads()} threads")
    print(f"GQA: q [B={B}, T={T}, Hq={Hq}, D={D}], k/v [B={B}, T={T}, Hkv={Hkv}, D={D}] (BSHD), "
          f"causal; each KV head serves {Hq // Hkv} query heads, K/V are not repeated\n")
    flops = 4 * B * Hq * T * T * D / 2  # causal forward
    ok = True
    torch.manual_seed(0)
    for dtype in dtypes:
        q = torch.randn(B, T, Hq, D, device=device, dtype=dtype)
        k = torch.randn(B, T, Hkv, D, device=device, dtype=dtype)
        v = torch.randn(B, T, Hkv, D, device=device, dtype=dtype)
        # SDPA wants [B, H, T, D]; give it contiguous tensors so its timing is not penalized.
        qh, kh, vh = (x.transpose(1, 2).contiguous() for x in (q, k, v))

        out, lse = attn_ops.attention(q, k, v, causal=True)
        ref = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True)
        ref = ref.transpose(1, 2)  # back to BSHD
        atol, rtol = TOL[dtype]
        diff = (out.float() - ref.float()).abs()
        out_ok = bool((diff <= atol + rtol * ref.float().abs()).all())

        # lse of the first KV group's query heads, in float64 from scratch
        g = Hq // Hkv
        s = torch.einsum("bqhd,bkd->bhqk", q[:, :, :g].double(), k[:, :, 0].double()) / math.sqrt(D)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=device).triu(1), -math.inf)
        lse_diff = float((lse[:, :g].double() - torch.logsumexp(s, dim=-1)).abs().max())
        lse_ok = lse.shape == (B, Hq, T) and lse.dtype == torch.float32 and lse_diff < 1e-3
        del s

        # the calls above were the warm-up
        t_ours = time_ms(lambda: attn_ops.attention(q, k, v, causal=True), device)
        t_sdpa = time_ms(lambda: F.scaled_dot_product_attention(qh, kh, vh, is_causal=True,
                                                                enable_gqa=True), device)
        name = str(dtype).replace("torch.", "")
        print(f"{name}:")
        print(f"  output {tuple(out.shape)} {str(out.dtype).replace('torch.', '')}, "
              f"lse {tuple(lse.shape)} {str(lse.dtype).replace('torch.', '')}")
        print(f"  max |attn_ops - SDPA|       = {float(diff.max()):.2e}  "
              f"(tolerance {atol:g} + {rtol:g}*|SDPA|)  {'OK' if out_ok else 'MISMATCH'}")
        print(f"  max |lse - float64 lse|     = {lse_diff:.2e}  (heads 0..{g - 1})  "
              f"{'OK' if lse_ok else 'MISMATCH'}")
        print(f"  forward  attn_ops {t_ours:8.1f} ms ({flops / t_ours / 1e6:6.1f} GFLOP/s)   "
              f"SDPA {t_sdpa:8.1f} ms ({flops / t_sdpa / 1e6:6.1f} GFLOP/s)   "
              f"SDPA/attn_ops = {t_sdpa / t_ours:.2f}x "
              f"({'attn_ops' if t_ours < t_sdpa else 'SDPA'} faster)")
        ok = ok and out_ok and lse_ok
    print("\nall checks passed" if ok else "\nFAILED: attn_ops disagrees with PyTorch")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
