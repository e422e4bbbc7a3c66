"""Independent reference for attn_ops.attention, in plain PyTorch math (docs/attention_api.md).

The reference materialises the full score matrix, expands K/V heads with repeat_interleave, builds
the mask explicitly from the masking rule of the contract and handles varlen batches by looping over
the sequences. It is differentiable: autograd through it gives the reference gradients.

`compute_dtype=torch.float64` (the default) gives the ground truth ("ref64"). The tolerance rule
(assert_close_to_ref) compares the op with ref64 against a baseline's error:

    max|ours - ref64| <= 2 * max|baseline - ref64| + floor

The baseline (same_dtype_ref) is what a correct kernel computes for the same inputs: for 16-bit inputs,
the reference in float32 from the same rounded inputs, with the probabilities rounded to the input dtype
before P V (as our kernels and SDPA round them), and the result rounded to the dtype once; for float32
and float64, the reference in that dtype. The floor is a few ulps of the accumulation dtype at the
output's scale (FLOOR_ULPS).

This file also holds the small input builders shared by the test files.
"""

import math

import torch

NEG_INF = float("-inf")


# --------------------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------------------
def visible_mask(Tq, Tk, *, causal=False, window_left=-1, window_right=-1, attention_chunk=0, device="cpu"):
    """Bool [Tq, Tk]: key j visible to query i, bottom-right aligned (offset = Tk - Tq); with attention_chunk
    C > 0, only keys in the query position's chunk (j // C == (i + offset) // C, floor division)."""
    if causal:
        window_right = 0
    i = torch.arange(Tq, device=device, dtype=torch.int64).unsqueeze(1)
    j = torch.arange(Tk, device=device, dtype=torch.int64).unsqueeze(0)
    offset = Tk - Tq
    vis = torch.ones(Tq, Tk, dtype=torch.bool, device=device)
    # A window wider than Tq + Tk is unbounded; clamp so that huge values cannot overflow int64.
    bound = Tq + Tk + 1
    if window_left >= 0:
        vis = vis & (j >= i + offset - min(window_left, bound))
    if window_right >= 0:
        vis = vis & (j <= i + offset + min(window_right, bound))
    if attention_chunk > 0:
        vis = vis & (torch.div(j, attention_chunk, rounding_mode="floor")
                     == torch.div(i + offset, attention_chunk, rounding_mode="floor"))
    return vis


def alibi_bias(slopes, B, Hq, Tq, Tk, dtype, device):
    """[B or 1, Hq, Tq, Tk]: -slope * |i + Tk - Tq - j| (FlashAttention 2's ALiBi, bottom-right aligned) for
    slopes [Hq] or [B, Hq]."""
    i = torch.arange(Tq, device=device).view(Tq, 1)
    j = torch.arange(Tk, device=device).view(1, Tk)
    distance = (i + Tk - Tq - j).abs().to(dtype)
    return -slopes.to(dtype).view(-1, Hq, 1, 1) * distance


def row_slopes(alibi_slopes, b):
    """The slopes of sequence b alone: [Hq] stays, [B, Hq] gives [1, Hq]."""
    if alibi_slopes is None or alibi_slopes.dim() == 1:
        return alibi_slopes
    return alibi_slopes[b:b + 1]


def _attention_dense_ref(q, k, v, scale, causal, window_left, window_right, softcap, sinks, attention_chunk,
                         alibi_slopes, cdt, p_dtype):
    B, Tq, Hq, Dqk = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    assert Hq % Hkv == 0
    group = Hq // Hkv
    q, k, v = q.to(cdt), k.to(cdt), v.to(cdt)
    qh = q.permute(0, 2, 1, 3)  # [B, Hq, Tq, Dqk]
    kh = k.permute(0, 2, 1, 3).repeat_interleave(group, dim=1)  # [B, Hq, Tk, Dqk]
    vh = v.permute(0, 2, 1, 3).repeat_interleave(group, dim=1)  # [B, Hq, Tk, Dv]
    s = torch.matmul(qh, kh.transpose(-1, -2)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:  # after the cap, as FlashAttention 2
        s = s + alibi_bias(alibi_slopes, B, Hq, Tq, Tk, cdt, q.device)
    vis = visible_mask(Tq, Tk, causal=causal, window_left=window_left, window_right=window_right,
                       attention_chunk=attention_chunk, device=q.device)
    vis = vis.expand(B, Hq, Tq, Tk)
    if sinks is not None:
        # A sink is one more key, always visible, of score sinks[h] and value 0.
        s = torch.cat([s, sinks.to(cdt).view(1, Hq, 1, 1).expand(B, Hq, Tq, 1)], dim=-1)
        vis = torch.cat([vis, vis.new_ones(B, Hq, Tq, 1)], dim=-1)
        vh = torch.cat([vh, vh.new_zeros(B, Hq, 1, vh.shape[-1])], dim=2)
    if s.shape[-1] > 0:
        # Row max over visible keys; detached (softmax and lse do not depend on it) and made safe
        # (0) for rows that see no key or only -inf scores (weight 0 each, as FlashAttention), so that
        # nothing below produces inf - inf or NaN gradients. A NaN or +inf max stays: the row is NaN.
        m = torch.where(vis, s, NEG_INF).amax(dim=-1, keepdim=True).detach()
        m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    else:
        m = s.new_zeros(B, Hq, Tq, 1)
    e = torch.where(vis, torch.exp(torch.where(vis, s, m) - m), torch.zeros_like(s))
    l = e.sum(dim=-1, keepdim=True)
    has_key = l != 0  # NaN sums count as "has a key": NaN reaches out and lse
    l_safe = torch.where(has_key, l, torch.ones_like(l))
    if p_dtype is None:
        out = torch.matmul(e / l_safe, vh)  # [B, Hq, Tq, Dv]; rows with no visible key are exactly 0
    else:
        # As the kernels: exp(s - max) rounded to p_dtype for the P V product, the sum l unrounded.
        out = torch.matmul(e.to(p_dtype).to(cdt), vh) / l_safe
    lse = torch.where(has_key, m + torch.log(l_safe), torch.full_like(l, NEG_INF)).squeeze(-1)
    return out.permute(0, 2, 1, 3).contiguous(), lse  # [B, Tq, Hq, Dv], [B, Hq, Tq]


def attention_ref(q, k, v, *, scale=None, causal=False, window_left=-1, window_right=-1,
                  softcap=0.0, cu_seqlens_q=None, cu_seqlens_k=None, sinks=None, attention_chunk=0,
                  alibi_slopes=None, compute_dtype=torch.float64, p_dtype=None):
    """Reference (out, lse) with the op's output shapes, computed in `compute_dtype`; with `p_dtype`, the
    probabilities are rounded to it before the product with V (the low-precision baseline, same_dtype_ref).

    dense : q [B, Tq, Hq, Dqk] -> out [B, Tq, Hq, Dv], lse [B, Hq, Tq]
    varlen: q [total_q, Hq, Dqk] -> out [total_q, Hq, Dv], lse [Hq, total_q]
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    args = (scale, causal, window_left, window_right, softcap, sinks, attention_chunk)
    if cu_seqlens_q is None:
        assert cu_seqlens_k is None
        return _attention_dense_ref(q, k, v, *args, alibi_slopes, compute_dtype, p_dtype)
    cq = [int(x) for x in cu_seqlens_q.cpu().tolist()]
    ck = [int(x) for x in cu_seqlens_k.cpu().tolist()]
    assert len(cq) == len(ck) and cq[0] == 0 and ck[0] == 0
    assert cq[-1] == q.shape[0] and ck[-1] == k.shape[0]
    Hq, Dv = q.shape[1], v.shape[2]
    outs, lses = [], []
    for b in range(len(cq) - 1):
        qs, qe, ks, ke = cq[b], cq[b + 1], ck[b], ck[b + 1]
        o, l = _attention_dense_ref(q[qs:qe].unsqueeze(0), k[ks:ke].unsqueeze(0),
                                    v[ks:ke].unsqueeze(0), *args, row_slopes(alibi_slopes, b), compute_dtype,
                                    p_dtype)
        outs.append(o[0])
        lses.append(l[0])
    if not outs:
        return (q.new_zeros(0, Hq, Dv, dtype=compute_dtype),
                q.new_zeros(Hq, 0, dtype=compute_dtype))
    return torch.cat(outs, dim=0), torch.cat(lses, dim=1)


# --------------------------------------------------------------------------------------------------
# Tolerance rule
# --------------------------------------------------------------------------------------------------
# The floor of the rule, in ulps of the accumulation dtype (float32 for 16-bit inputs) at the output's scale
# (max|ref64|). The 2x baseline term carries the real budget: a result rounded once to a 16-bit dtype errs by up
# to half an ulp, and the baseline's largest element error is near that too. The floor only covers what the
# baseline cannot: a kernel summing in another order, its exp approximation, and P rounded against a running
# maximum (online softmax) instead of the row's.
# float64's baseline is the reference itself (error 0), so its floor alone covers the summation order: up to
# 20 ulps measured over rows of a few thousand keys.
FLOOR_ULPS = {
    torch.float64: 64,
    torch.float32: 16,
    torch.float16: 16,
    torch.bfloat16: 16,
}


def rule_floor(dtype, scale, rounded_intermediates=False, max_logit=1.0):
    """The rule's floor for results of `dtype` whose largest reference magnitude is `scale`.

    max_logit: the largest |logit| (|lse|) behind the result, where it exceeds 1: an ulp of a logit L moves its
    exponential by L ulps, so the floor grows with it (merged partials at lse ~ 150, test_distributed.py).

    rounded_intermediates: the kernel rounds intermediate tiles to a 16-bit `dtype` in an order the baseline
    cannot follow (the backward's P and dS before their products, as SDPA's CPU kernel and FlashAttention do;
    autograd through the float32 reference keeps them in float32): half an ulp of the dtype at the result's
    scale more (measured: up to 0.27 ulp, in test_attention_backward*.py)."""
    floor = FLOOR_ULPS[dtype] * torch.finfo(accumulation_dtype(dtype)).eps * scale * max(1.0, max_logit)
    if rounded_intermediates and accumulation_dtype(dtype) != dtype:
        floor += 0.5 * torch.finfo(dtype).eps * scale
    return floor


def assert_close_to_ref(ours, ref64, same_dtype, eps=None, name="tensor", rounded_intermediates=False,
                        max_logit=1.0):
    """Tolerance rule: max|ours - ref64| <= 2 * max|same_dtype - ref64| + floor.

    `same_dtype` is the baseline (same_dtype_ref). Entries where ref64 is -inf (lse of rows with no visible
    key) must be -inf in `ours` too, and only those; `ours` must never hold NaN. `eps=None` takes the floor
    rule_floor(same_dtype.dtype, max|ref64|, rounded_intermediates, max_logit). Returns the max error seen.
    """
    assert tuple(ours.shape) == tuple(ref64.shape), \
        f"{name}: shape {tuple(ours.shape)} != reference {tuple(ref64.shape)}"
    assert tuple(same_dtype.shape) == tuple(ref64.shape)
    o = ours.detach().to("cpu", torch.float64)
    r = ref64.detach().to("cpu", torch.float64)
    s = same_dtype.detach().to("cpu", torch.float64)
    assert not torch.isnan(o).any(), f"{name}: NaN in the op's result"
    ref_neginf = torch.isneginf(r)
    bad = torch.isneginf(o) != ref_neginf
    assert not bad.any(), (
        f"{name}: -inf pattern differs from the reference at {int(bad.sum())} entries "
        f"(first at {tuple(bad.nonzero()[0].tolist())})")
    finite = ~ref_neginf
    if not finite.any():
        return 0.0
    o, r, s = o[finite], r[finite], s[finite]
    assert torch.isfinite(o).all(), f"{name}: inf in the op's result where the reference is finite"
    if eps is None:
        eps = rule_floor(same_dtype.dtype, r.abs().max().item(), rounded_intermediates, max_logit)
    err = (o - r).abs().max().item()
    same_err = (s - r).abs().max().item()
    bound = 2 * same_err + eps
    assert err <= bound, (
        f"{name}: max|ours - ref64| = {err:.3e} > 2 * max|baseline - ref64| + floor = "
        f"2 * {same_err:.3e} + {eps:.1e} = {bound:.3e} (dtype {same_dtype.dtype})")
    return err


def accumulation_dtype(dtype):
    """The dtype the kernels accumulate in for inputs of `dtype`: float32 for 16-bit dtypes, else the dtype."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def same_dtype_ref(ref_fn, *args, compute_dtype, **kw):
    """The rule's baseline (out, lse) for inputs of `compute_dtype`, from the reference `ref_fn`.

    16-bit inputs: computed in float32 from the same (rounded) inputs, P rounded to the input dtype
    (`p_dtype`), out rounded to the dtype once and lse kept in float32, as the kernels do. A baseline run in
    bfloat16 throughout errs by 2-3% of the largest output, which let a 1% error in the kernel pass."""
    if accumulation_dtype(compute_dtype) == compute_dtype:
        return ref_fn(*args, compute_dtype=compute_dtype, **kw)
    out, lse = ref_fn(*args, compute_dtype=accumulation_dtype(compute_dtype), p_dtype=compute_dtype, **kw)
    return out.to(compute_dtype), lse


def assert_attention_close_to_ref(ours, inputs, **kw):
    """ours = (out, lse) of attention on inputs = (q, k, v) against attention_ref in float64, with the
    same-dtype reference's error as the bound (assert_close_to_ref); kw: attention_ref's options."""
    r64 = attention_ref(*inputs, **kw)
    same = same_dtype_ref(attention_ref, *inputs, **kw, compute_dtype=inputs[0].dtype)
    assert_close_to_ref(ours[0], r64[0], same[0], name="out")
    assert_close_to_ref(ours[1], r64[1], same[1], name="lse")


# --------------------------------------------------------------------------------------------------
# Input builders shared by the tests
# --------------------------------------------------------------------------------------------------
def make_bshd(B, S, H, D, *, dtype=torch.float32, device="cpu", layout="contiguous"):
    """Random [B, S, H, D] with a given memory layout (always a stride-1 last dim).

    contiguous : plain contiguous tensor
    transposed : built [B, H, S, D] contiguous then .transpose(1, 2) (a BSHD view, not a copy)
    sliced     : the first D columns of a [B, S, H, D + 3] tensor (odd row strides)
    expanded   : [1, S, H, D] expanded over the batch (stride 0 on the batch dim)
    """
    if layout == "contiguous":
        return torch.randn(B, S, H, D, dtype=dtype, device=device)
    if layout == "transposed":
        return torch.randn(B, H, S, D, dtype=dtype, device=device).transpose(1, 2)
    if layout == "sliced":
        return torch.randn(B, S, H, D + 3, dtype=dtype, device=device)[..., :D]
    if layout == "expanded":
        return torch.randn(1, S, H, D, dtype=dtype, device=device).expand(B, S, H, D)
    raise ValueError(layout)


def make_thd(T, H, D, *, dtype=torch.float32, device="cpu", layout="contiguous"):
    """Random packed [T, H, D] (varlen) with a given memory layout."""
    if layout == "contiguous":
        return torch.randn(T, H, D, dtype=dtype, device=device)
    if layout == "transposed":
        return torch.randn(H, T, D, dtype=dtype, device=device).transpose(0, 1)
    if layout == "sliced":
        return torch.randn(T, H, D + 3, dtype=dtype, device=device)[..., :D]
    raise ValueError(layout)


def cu_seqlens(lengths, device="cpu"):
    """int32 [len(lengths) + 1] cumulative sequence starts."""
    c = [0]
    for n in lengths:
        c.append(c[-1] + n)
    return torch.tensor(c, dtype=torch.int32, device=device)


def dense_inputs(B, Tq, Tk, Hq, Hkv, Dqk, Dv, dtype, device, layouts=("contiguous",) * 3):
    q = make_bshd(B, Tq, Hq, Dqk, dtype=dtype, device=device, layout=layouts[0])
    k = make_bshd(B, Tk, Hkv, Dqk, dtype=dtype, device=device, layout=layouts[1])
    v = make_bshd(B, Tk, Hkv, Dv, dtype=dtype, device=device, layout=layouts[2])
    return q, k, v


def varlen_inputs(lens_q, lens_k, Hq, Hkv, Dqk, Dv, dtype, device, layout="contiguous"):
    q = make_thd(sum(lens_q), Hq, Dqk, dtype=dtype, device=device, layout=layout)
    k = make_thd(sum(lens_k), Hkv, Dqk, dtype=dtype, device=device, layout=layout)
    v = make_thd(sum(lens_k), Hkv, Dv, dtype=dtype, device=device, layout=layout)
    return q, k, v, cu_seqlens(lens_q, device), cu_seqlens(lens_k, device)


def ref_kwargs(kw):
    """The op's keyword arguments that the reference takes (max_seqlen_* dropped)."""
    return {k: v for k, v in kw.items() if k not in ("max_seqlen_q", "max_seqlen_k")}
