"""Independent reference for attn_ops.rotary_embedding / rotary_embedding_ (docs/rotary_api.md).

Two formulations, both in plain PyTorch and differentiable in x (autograd through them gives the
reference gradients):

* half-split (interleaved=False): HuggingFace Llama's ``x * cos + rotate_half(x) * sin`` with the
  ``[.., rotary_dim / 2]`` tables duplicated to the full rotary_dim (``cat(cos, cos)``), as HF's caches;
* interleaved (interleaved=True): an explicit rotation of the even/odd pairs ``(x[2i], x[2i + 1])``.

Only the first rotary_dim = 2 * cos.size(1) features rotate; the tail is copied unchanged. inverse=True
rotates by the negated angle. `compute_dtype=torch.float64` (default) is the ground truth ("ref64");
`compute_dtype=x.dtype` runs the same math in x's dtype, tables rounded to it ("same dtype"), which sets
the error budget of reference.assert_close_to_ref.
"""

import math

import torch


def rotate_half(x):
    """HuggingFace transformers' rotate_half: [x1, x2] -> [-x2, x1]."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_ref(x, cos, sin, positions, *, interleaved=False, inverse=False,
             compute_dtype=torch.float64):
    """Rotated x (shape of x, dtype compute_dtype). x [..., H, D], positions x.shape[:-2]."""
    assert tuple(positions.shape) == tuple(x.shape[:-2])
    half = cos.shape[1]
    rd = 2 * half
    assert rd <= x.shape[-1]
    idx = positions.long()
    c = cos.to(compute_dtype)[idx].unsqueeze(-2)  # [..., 1, rd / 2], broadcast over heads
    s = sin.to(compute_dtype)[idx].unsqueeze(-2)
    if inverse:
        s = -s
    xc = x.to(compute_dtype)
    rot, tail = xc[..., :rd], xc[..., rd:]
    if interleaved:
        a, b = rot[..., 0::2], rot[..., 1::2]
        ya = a * c - b * s
        yb = b * c + a * s
        rotated = torch.stack((ya, yb), dim=-1).flatten(-2)
    else:
        cf = torch.cat((c, c), dim=-1)  # HF cache layout: the two halves equal
        sf = torch.cat((s, s), dim=-1)
        rotated = rot * cf + rotate_half(rot) * sf
    return torch.cat((rotated, tail), dim=-1)


def default_inv_freq(rotary_dim, theta):
    """RoFormer's frequencies, in Python's math: pair i turns by theta ** (-2i / d) per position."""
    return [theta ** (-2.0 * i / rotary_dim) for i in range(rotary_dim // 2)]


def yarn_inv_freq(rotary_dim, theta, factor, original_max_positions, *, beta_fast=32.0, beta_slow=1.0,
                  truncate=True):
    """YaRN's frequencies (Peng et al. 2023, arXiv:2309.00071, "NTK-by-parts"), as HF's rope_type "yarn"
    defines them: pairs that turn more than beta_fast times over the original context keep their
    frequency, pairs that turn fewer than beta_slow times are interpolated (frequency / factor), with a
    linear ramp over the pair index between the two (bounds rounded outwards unless truncate=False)."""
    def pair_turning(turns):  # the (fractional) pair index that turns `turns` times over the original context
        return rotary_dim * math.log(original_max_positions / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = pair_turning(beta_fast), pair_turning(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001
    out = []
    for i, f in enumerate(default_inv_freq(rotary_dim, theta)):
        interpolated = min(max((i - low) / (high - low), 0.0), 1.0)
        out.append(f / factor * interpolated + f * (1.0 - interpolated))
    return out


def yarn_attention_factor(factor, mscale=None, mscale_all_dim=None):
    """YaRN's cos / sin multiplier 0.1 ln(factor) + 1 (1 for factor <= 1); DeepSeek's form: the ratio of
    0.1 mscale ln(factor) + 1 to 0.1 mscale_all_dim ln(factor) + 1 when both are given."""
    def m(scale):
        return 1.0 if factor <= 1 else 0.1 * scale * math.log(factor) + 1.0
    return m(mscale) / m(mscale_all_dim) if mscale and mscale_all_dim else m(1.0)


def cos_sin_formula(max_positions, rotary_dim, theta):
    """float64 [max_positions, rotary_dim / 2] cos / sin from theta ** (-2i / d), in Python's math."""
    return cos_sin_of(max_positions, default_inv_freq(rotary_dim, theta))


def cos_sin_of(max_positions, inv_freq, scale=1.0):
    """float64 [max_positions, len(inv_freq)] scale * cos / sin of p * inv_freq[i], in Python's math
    (scale: YaRN's attention factor, which HF multiplies into its tables)."""
    cos = torch.empty(max_positions, len(inv_freq), dtype=torch.float64)
    sin = torch.empty_like(cos)
    for i, f in enumerate(inv_freq):
        for p in range(max_positions):
            cos[p, i] = scale * math.cos(p * f)
            sin[p, i] = scale * math.sin(p * f)
    return cos, sin


def assert_table_from_formula(table, exact, name="table"):
    """A module's rotary table (cos or sin) against the formula's float64 values: a float64 table within
    1e-12 (the last bits of libm's pow / cos over angles up to 4096), any other rounded once from them
    (half an ulp, 2^-25 for |v| <= 1; 2^-24 allows for the float64 last bit)."""
    atol = 1e-12 if table.dtype == torch.float64 else 2.0 ** -24
    torch.testing.assert_close(table.detach().to("cpu", torch.float64), exact, rtol=0, atol=atol,
                               msg=lambda m: f"{name}: not the formula's table\n{m}")


MANTISSA_BITS = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23, torch.float64: 52}


def assert_rounded_once(ours, ref64, x, name="out"):
    """"Computed in float32 (float64), rounded to x's dtype once": |ours - ref64| <= 1 ulp of ref64 in
    x's dtype (1/2 ulp of rounding plus accumulation noise), plus accumulation noise relative to the
    inputs' magnitude (cancellation near 0)."""
    dt = ours.dtype
    o = ours.detach().to("cpu", torch.float64)
    r = ref64.detach().to("cpu", torch.float64)
    _, e = torch.frexp(r)  # |r| in [2^(e-1), 2^e)
    ulp = torch.ldexp(torch.ones_like(r), (e - 1 - MANTISSA_BITS[dt]).to(torch.int32))
    acc_eps = 2.0 ** -52 if dt == torch.float64 else 2.0 ** -22
    noise = 4 * acc_eps * max(1.0, x.detach().abs().max().item())
    err = (o - r).abs()
    bad = err > ulp + noise
    assert not bad.any(), (
        f"{name}: {int(bad.sum())} entries are not the once-rounded {dt} result, e.g. at "
        f"{tuple(bad.nonzero()[0].tolist())}: ours {o[bad][0].item()!r}, ref64 {r[bad][0].item()!r}")
