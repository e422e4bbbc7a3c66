"""Independent reference for attn_ops.attention, in plain PyTorch math (docs/attention_api.md).

The reference materialises the full score matrix, expands K/V heads with repeat_interleave, builds
the mask explicitly from the masking rule of the contract and handles varlen batches by looping over
the sequences. It is differentiable: autograd through it gives the reference gradients.

`compute_dtype=torch.float64` (the default) gives the ground truth ("ref64");
`compute_dtype=q.dtype` runs the same math in the input dtype ("torch_same_dtype"), which sets the
error budget of the tolerance rule (FlashAttention's testing rule):

    max|ours - ref64| <= 2 * max|same_dtype - ref64| + eps

This file also holds the small input builders shared by the test files.
"""

import math

import torch

NEG_INF = float("-inf")


# --------------------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------------------
def visible_mask(Tq, Tk, *, causal=False, window_left=-1, window_right=-1, device="cpu"):
    """Bool [Tq, Tk]: key j visible to query i, bottom-right aligned (offset = Tk - Tq)."""
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
    return vis


def _attention_dense_ref(q, k, v, scale, causal, window_left, window_right, softcap, cdt):
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
    vis = visible_mask(Tq, Tk, causal=causal, window_left=window_left,
                       window_right=window_right, device=q.device)
    vis = vis.expand(B, Hq, Tq, Tk)
    if Tk > 0:
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
    p = e / l_safe
    out = torch.matmul(p, vh)  # [B, Hq, Tq, Dv]; rows with no visible key are exactly 0
    lse = torch.where(has_key, m + torch.log(l_safe), torch.full_like(l, NEG_INF)).squeeze(-1)
    return out.permute(0, 2, 1, 3).contiguous(), lse  # [B, Tq, Hq, Dv], [B, Hq, Tq]


def attention_ref(q, k, v, *, scale=None, causal=False, window_left=-1, window_right=-1,
                  softcap=0.0, cu_seqlens_q=None, cu_seqlens_k=None,
                  compute_dtype=torch.float64):
    """Reference (out, lse) with the op's output shapes, computed in `compute_dtype`.

    dense : q [B, Tq, Hq, Dqk] -> out [B, Tq, Hq, Dv], lse [B, Hq, Tq]
    varlen: q [total_q, Hq, Dqk] -> out [total_q, Hq, Dv], lse [Hq, total_q]
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    args = (scale, causal, window_left, window_right, softcap, compute_dtype)
    if cu_seqlens_q is None:
        assert cu_seqlens_k is None
        return _attention_dense_ref(q, k, v, *args)
    cq = [int(x) for x in cu_seqlens_q.cpu().tolist()]
    ck = [int(x) for x in cu_seqlens_k.cpu().tolist()]
    assert len(cq) == len(ck) and cq[0] == 0 and ck[0] == 0
    assert cq[-1] == q.shape[0] and ck[-1] == k.shape[0]
    Hq, Dv = q.shape[1], v.shape[2]
    outs, lses = [], []
    for b in range(len(cq) - 1):
        qs, qe, ks, ke = cq[b], cq[b + 1], ck[b], ck[b + 1]
        o, l = _attention_dense_ref(q[qs:qe].unsqueeze(0), k[ks:ke].unsqueeze(0),
                                    v[ks:ke].unsqueeze(0), *args)
        outs.append(o[0])
        lses.append(l[0])
    if not outs:
        return (q.new_zeros(0, Hq, Dv, dtype=compute_dtype),
                q.new_zeros(Hq, 0, dtype=compute_dtype))
    return torch.cat(outs, dim=0), torch.cat(lses, dim=1)


# --------------------------------------------------------------------------------------------------
# Tolerance rule
# --------------------------------------------------------------------------------------------------
# eps, relative to max(1, max|ref64|) (ulps grow with the magnitude of the values compared):
#  float64 : 1e-10 -- the op accumulates in float64; only summation order differs (~1e-15 rel).
#  float32 : 1e-5  -- tiled online softmax sums in another order than the materialised reference;
#                     covers cases where the float32 reference is exact by chance (e.g. one key).
#  float16 : 1e-3  -- about one fp16 ulp at 1.0 (2^-10): the op rounds its float32 result to fp16
#                     once (<= 1/2 ulp) plus float32 accumulation noise.
#  bfloat16: 8e-3  -- about one bf16 ulp at 1.0 (2^-7), same reasoning.
# The term 2 * max|same_dtype - ref64| dominates in practice for the low-precision dtypes.
EPS = {
    torch.float64: 1e-10,
    torch.float32: 1e-5,
    torch.float16: 1e-3,
    torch.bfloat16: 8e-3,
}


def assert_close_to_ref(ours, ref64, same_dtype, eps=None, name="tensor"):
    """Tolerance rule: max|ours - ref64| <= 2 * max|same_dtype - ref64| + eps.

    Entries where ref64 is -inf (lse of rows with no visible key) must be -inf in `ours` too, and
    only those; `ours` must never hold NaN. `eps=None` picks EPS[same_dtype.dtype] scaled by
    max(1, max|ref64|). Returns the max error seen.
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
        eps = EPS[same_dtype.dtype] * max(1.0, r.abs().max().item())
    err = (o - r).abs().max().item()
    same_err = (s - r).abs().max().item()
    bound = 2 * same_err + eps
    assert err <= bound, (
        f"{name}: max|ours - ref64| = {err:.3e} > 2 * max|same_dtype - ref64| + eps = "
        f"2 * {same_err:.3e} + {eps:.1e} = {bound:.3e} (dtype {same_dtype.dtype})")
    return err


def accumulation_dtype(dtype):
    """The dtype the kernels accumulate in for inputs of `dtype`: float32 for 16-bit dtypes, else the dtype."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def same_dtype_ref(ref_fn, *args, compute_dtype, **kw):
    """(out, lse) of the reference `ref_fn` as the op computes them for inputs of `compute_dtype`: out in that
    dtype; lse, which the op returns in float32 (accumulated in float32 for every input dtype), from the
    float32 computation for 16-bit dtypes: the 16-bit computation's lse error is large enough to let an lse
    rounded to bfloat16 pass."""
    out, lse = ref_fn(*args, compute_dtype=compute_dtype, **kw)
    if accumulation_dtype(compute_dtype) != compute_dtype:
        lse = ref_fn(*args, compute_dtype=accumulation_dtype(compute_dtype), **kw)[1]
    return out, lse


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
