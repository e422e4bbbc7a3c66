"""Independent float64 references of the lightning attention ops (docs/lightning_api.md).

`recurrence` is the token-by-token definition, S_t = exp(-slope) S_{t-1} + k_t^T v_t, o_t = scale q_t S_t,
with K/V heads expanded by repeat_interleave and varlen batches looped sequence by sequence; it is
differentiable, so autograd through it gives the reference gradients. `compute_dtype=q.dtype` runs the
same math in the input dtype (the error budget of the tolerance rule).
"""


import torch


def minimax_slopes(heads, layer_idx=0, num_layers=1):
    """MiniMax-Text-01's decay rates of one layer: 2^(-8 (h+1) / H), scaled down linearly with depth."""
    base = 1 / (2 ** (8 / heads))
    factor = 1 - layer_idx / (num_layers - 1 + 1e-5) + 1e-5
    return (base ** (torch.arange(heads, dtype=torch.float64) + 1) * factor).to(torch.float32)


def _stream(q, k, v, slope, scale, state):
    """One sequence: q [T, H, Dk], k [T, H, Dk], v [T, H, Dv] (K/V already per query head), state [H, Dk, Dv]."""
    decay = torch.exp(-slope.to(state.dtype))[:, None, None]
    outs = []
    for t in range(q.shape[0]):
        state = decay * state + k[t][:, :, None] * v[t][:, None, :]
        outs.append(scale * torch.einsum("hd,hde->he", q[t], state))
    out = torch.stack(outs) if outs else q.new_zeros((0, q.shape[1], v.shape[-1]))
    return out, state


def recurrence(q, k, v, slope, *, scale=1.0, initial_state=None, cu_seqlens=None, compute_dtype=torch.float64,
               round_out=True):
    """Reference (out, final_state) of lightning_attention, computed in `compute_dtype`; out rounded to q's dtype
    unless round_out is False (a float64 reference to measure a low-precision output against)."""
    cdt = compute_dtype
    group = q.shape[-2] // k.shape[-2]
    qc, kc, vc = q.to(cdt), k.repeat_interleave(group, -2).to(cdt), v.repeat_interleave(group, -2).to(cdt)
    H, Dk, Dv = q.shape[-2], q.shape[-1], v.shape[-1]
    if cu_seqlens is None:
        seqs = [(qc[b], kc[b], vc[b]) for b in range(q.shape[0])]
    else:
        cu = cu_seqlens.tolist()
        seqs = [(qc[s:e], kc[s:e], vc[s:e]) for s, e in zip(cu[:-1], cu[1:])]
    outs, states = [], []
    for b, (qs, ks, vs) in enumerate(seqs):
        s0 = initial_state[b].to(cdt) if initial_state is not None else torch.zeros(H, Dk, Dv, dtype=cdt,
                                                                                    device=q.device)
        o, s = _stream(qs, ks, vs, slope, scale, s0)
        outs.append(o)
        states.append(s)
    if not outs:  # no sequence: B = 0
        out = qc.new_zeros((0, *q.shape[1:-1], Dv))
    else:
        out = torch.stack(outs) if cu_seqlens is None else torch.cat(outs)
    final = torch.stack(states) if states else torch.zeros(0, H, Dk, Dv, dtype=cdt, device=q.device)
    return (out.to(q.dtype) if round_out else out), final


def assert_close_rule(ours, ref64, same, eps):
    """|ours - ref64| <= 2 * |same_dtype - ref64| + eps (FlashAttention's rule), elementwise maxima."""
    err = (ours.double() - ref64.double()).abs().max().item() if ours.numel() else 0.0
    budget = 2 * ((same.double() - ref64.double()).abs().max().item() if same.numel() else 0.0) + eps
    assert err <= budget, f"max error {err:.3e} exceeds 2 * same-dtype error + eps = {budget:.3e}"
