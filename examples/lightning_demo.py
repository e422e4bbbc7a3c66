"""The MiniMax-style part of the demo: lightning (linear) attention layers decoding from a fixed-size state.

A residual stack of attn_ops.nn.LightningAttention layers prefills a batch of prompts into a
LinearAttentionState (one slot per sequence), then decodes token by token, each step updating the state
pool in place. The outputs are checked against running the whole sequence at once (the differentiable op),
and the state size is compared with the KV cache a softmax layer of the same shape would need."""

import time

import torch

from attn_ops.nn import LightningAttention, LinearAttentionState


def run(device, dtype, *, batch=4, prompt=256, new_tokens=32, dim=512, heads=8, layers=4) -> bool:
    torch.manual_seed(0)
    stack = torch.nn.ModuleList(
        LightningAttention(dim, heads, layer_idx=i, num_layers=layers) for i in range(layers)).to(device, dtype).eval()
    head_dim = dim // heads
    x = torch.randn(batch, prompt + new_tokens, dim, device=device, dtype=dtype) * 0.5

    def forward(h, **kw):
        for layer in stack:
            h = h + layer(h, **kw)
        return h

    with torch.no_grad():
        full = forward(x)  # every position at once, from zero states
        pool = LinearAttentionState(layers, batch, heads, head_dim, device=device)
        slots = pool.allocate(batch)
        t0 = time.perf_counter()
        steps = [forward(x[:, :prompt], state=pool, state_indices=slots)]
        t1 = time.perf_counter()
        for t in range(prompt, prompt + new_tokens):
            steps.append(forward(x[:, t:t + 1], state=pool, state_indices=slots))
        t2 = time.perf_counter()
    err = (torch.cat(steps, 1).float() - full.float()).abs().max().item()
    tol = 1e-3 if dtype == torch.float32 else 5e-2
    state_bytes = sum(p[0].numel() * p.element_size() for p in pool.states)
    kv_bytes = layers * 2 * heads * head_dim * torch.finfo(dtype).bits // 8 * (prompt + new_tokens)
    print(f"MiniMax-style lightning attention: {layers} LightningAttention layers (dim {dim}, {heads} heads of "
          f"{head_dim}), batch {batch}")
    print(f"  prefill {prompt} tokens into the state pool: {(t1 - t0) * 1e3:.1f} ms; decode {new_tokens} steps: "
          f"{batch * new_tokens / (t2 - t1):.0f} tokens/s")
    print(f"  step-by-step vs whole-sequence max |diff| {err:.2e} ({'ok' if err <= tol else 'MISMATCH'})")
    print(f"  state per sequence {state_bytes / 1024:.0f} KiB, fixed; a softmax KV cache of the same heads "
          f"would hold {kv_bytes / 1024:.0f} KiB at {prompt + new_tokens} tokens and keep growing\n")
    return err <= tol
