"""Tests of the rotary position embedding ops (docs/rotary_api.md): torch.ops.attn_ops.rotary_embedding
(out of place, differentiable) and rotary_embedding_ (in place), and attn_ops.rotary_cos_sin.

- rotary_cos_sin against theta ** (-2i / d) computed directly;
- forward against the float64 reference (HF rotate_half for half-split, explicit pair rotation for
  interleaved) with the tolerance rule and the "computed in float32, rounded once" rule, for every dtype,
  both conventions, partial rotary, tables in float32 and in x's dtype, int32 / int64 positions,
  [B, T, H, D] and packed [N, H, D], non-contiguous x;
- inverse=True, the in-place op (same values, same storage, writes through views);
- gradcheck in float64, gradients against the reference's autograd in every dtype;
- every error message of the contract (a rejected in-place call leaves x unchanged);
- torch.library.opcheck on both ops, torch.compile(fullgraph=True) of a function using both.
"""

import re

import pytest
import torch
from torch.autograd import gradcheck
from torch.library import opcheck

import attn_ops
from error_helpers import expect_error
from reference import assert_close_to_ref
from rope_reference import assert_rounded_once, cos_sin_formula, rope_ref, rotate_half

OP = torch.ops.attn_ops.rotary_embedding
OP_ = torch.ops.attn_ops.rotary_embedding_
ALL_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
MAX_POS = 50


def dtype_id(dt):
    return str(dt).replace("torch.", "")


# --------------------------------------------------------------------------------------------------
# Input builders
# --------------------------------------------------------------------------------------------------
def make_x(kind, lead, H, D, dtype, device):
    """x with leading dims `lead`, H heads, head_dim D, in a given memory layout.

    contiguous : plain tensor
    transposed : [B, H, T, D] (or [H, N, D]) contiguous, heads moved next to the last dim (a view)
    sliced     : the first D features of a [..., H, D + 3] tensor (odd strides)
    expanded   : stride 0 on the first leading dim
    """
    if kind == "contiguous":
        return torch.randn(*lead, H, D, dtype=dtype, device=device)
    if kind == "transposed":
        if len(lead) == 2:
            return torch.randn(lead[0], H, lead[1], D, dtype=dtype, device=device).transpose(1, 2)
        return torch.randn(H, lead[0], D, dtype=dtype, device=device).transpose(0, 1)
    if kind == "sliced":
        return torch.randn(*lead, H, D + 3, dtype=dtype, device=device)[..., :D]
    if kind == "expanded":
        return torch.randn(1, *lead[1:], H, D, dtype=dtype, device=device).expand(*lead, H, D)
    raise ValueError(kind)


def make_positions(lead, dtype, device, max_pos=MAX_POS, transposed=False):
    """Random positions in [0, max_pos), with both ends of the table present."""
    if transposed and len(lead) == 2:
        pos = torch.randint(0, max_pos, (lead[1], lead[0])).t()
    else:
        pos = torch.randint(0, max_pos, tuple(lead))
    flat = pos.view(-1) if pos.is_contiguous() else None
    if flat is not None and flat.numel() >= 2:
        flat[0], flat[-1] = max_pos - 1, 0
    elif pos.numel() >= 2:
        pos[0, 0], pos[-1, -1] = max_pos - 1, 0
    return pos.to(dtype=dtype, device=device)


def tables(rotary_dim, dtype, device, max_pos=MAX_POS, theta=10000.0):
    return attn_ops.rotary_cos_sin(max_pos, rotary_dim, theta, dtype=dtype, device=device)


def check_against_ref(ours, x, cos, sin, pos, interleaved=False, inverse=False, name="out"):
    assert ours.shape == x.shape and ours.dtype == x.dtype and ours.device == x.device
    ref64 = rope_ref(x, cos, sin, pos, interleaved=interleaved, inverse=inverse)
    same = rope_ref(x, cos, sin, pos, interleaved=interleaved, inverse=inverse,
                    compute_dtype=x.dtype)
    assert_close_to_ref(ours, ref64, same, name=name)
    assert_rounded_once(ours, ref64, x, name=name)
    return ref64


# --------------------------------------------------------------------------------------------------
# rotary_cos_sin
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("max_pos, rotary_dim, theta", [(64, 16, 10000.0), (33, 6, 500000.0),
                                                         (5, 2, 10.0)])
def test_cos_sin_formula(max_pos, rotary_dim, theta, device):
    cos64, sin64 = cos_sin_formula(max_pos, rotary_dim, theta)
    c, s = attn_ops.rotary_cos_sin(max_pos, rotary_dim, theta, dtype=torch.float64, device=device)
    assert c.shape == (max_pos, rotary_dim // 2) and c.dtype == torch.float64
    assert c.device.type == torch.device(device).type
    torch.testing.assert_close(c.cpu(), cos64, rtol=0, atol=1e-12)
    torch.testing.assert_close(s.cpu(), sin64, rtol=0, atol=1e-12)
    c32, s32 = attn_ops.rotary_cos_sin(max_pos, rotary_dim, theta, device=device)  # float32 default
    assert c32.dtype == torch.float32 and s32.shape == (max_pos, rotary_dim // 2)
    # rounded once from float64: within half an ulp (2^-25 for |v| <= 1) of the exact values
    torch.testing.assert_close(c32.cpu().double(), cos64, rtol=0, atol=2.0 ** -24)
    torch.testing.assert_close(s32.cpu().double(), sin64, rtol=0, atol=2.0 ** -24)
    cb, _ = attn_ops.rotary_cos_sin(max_pos, rotary_dim, theta, dtype=torch.bfloat16, device=device)
    torch.testing.assert_close(cb.cpu().double(), cos64, rtol=2.0 ** -8, atol=2.0 ** -9)


def test_cos_sin_odd_rotary_dim():
    with pytest.raises(ValueError, match=re.escape("rotary_dim must be a positive even number, got 7")):
        attn_ops.rotary_cos_sin(16, 7)


def test_hf_rotate_half_with_hf_cache(device):
    """HF's [max_positions, head_dim] cache with equal halves, passed as cos[:, :head_dim // 2]
    (a strided slice of the cache), gives HF's apply_rotary_pos_emb."""
    B, T, H, D = 2, 9, 3, 16
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.arange(MAX_POS, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos_hf, sin_hf = emb.cos().to(device), emb.sin().to(device)
    x = torch.randn(B, T, H, D, dtype=torch.float64, device=device)
    pos = make_positions((B, T), torch.int64, device)
    expected = x * cos_hf[pos].unsqueeze(2) + rotate_half(x) * sin_hf[pos].unsqueeze(2)
    ours = attn_ops.rotary_embedding(x, cos_hf[:, : D // 2], sin_hf[:, : D // 2], pos)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-12)
    # and the tables of rotary_cos_sin are the first halves of HF's cache
    c, s = tables(D, torch.float64, device)
    torch.testing.assert_close(c, cos_hf[:, : D // 2], rtol=0, atol=1e-12)
    torch.testing.assert_close(s, sin_hf[:, : D // 2], rtol=0, atol=1e-12)


# --------------------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------------------
# (lead dims, heads, head_dim, rotary_dim)
SHAPES = {
    ("bthd", "full"): ((2, 7), 3, 64, 64),
    ("bthd", "partial"): ((2, 7), 3, 80, 32),
    ("packed", "full"): ((11,), 2, 32, 32),
    ("packed", "partial"): ((11,), 2, 40, 16),
}


@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64], ids=dtype_id)
@pytest.mark.parametrize("table", ["table_f32", "table_xdtype"])
@pytest.mark.parametrize("rotary", ["full", "partial"])
@pytest.mark.parametrize("shape", ["bthd", "packed"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["halfsplit", "interleaved"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_forward_matches_reference(dtype, interleaved, shape, rotary, table, pos_dtype, device):
    lead, H, D, rd = SHAPES[(shape, rotary)]
    x = make_x("contiguous", lead, H, D, dtype, device)
    x0 = x.clone()
    cos, sin = tables(rd, torch.float32 if table == "table_f32" else dtype, device)
    pos = make_positions(lead, pos_dtype, device)
    out = attn_ops.rotary_embedding(x, cos, sin, pos, interleaved=interleaved)
    assert out.data_ptr() != x.data_ptr()
    assert torch.equal(x, x0), "the out-of-place op changed x"
    check_against_ref(out, x, cos, sin, pos, interleaved)
    # the tail past rotary_dim passes through bit for bit
    assert torch.equal(out[..., rd:], x[..., rd:])
    # the wrapper is the op with inverse=False
    assert torch.equal(out, OP(x, cos, sin, pos, interleaved=interleaved, inverse=False))


def test_default_is_half_split(device):
    x = torch.randn(3, 2, 8, device=device)
    cos, sin = tables(8, torch.float32, device)
    pos = torch.tensor([0, 5, 9], device=device)
    assert torch.equal(attn_ops.rotary_embedding(x, cos, sin, pos),
                       attn_ops.rotary_embedding(x, cos, sin, pos, interleaved=False))
    assert torch.equal(OP(x, cos, sin, pos), OP(x, cos, sin, pos, interleaved=False, inverse=False))
    # position 0 is the identity
    z = torch.zeros(3, dtype=torch.int64, device=device)
    assert torch.equal(OP(x, cos, sin, z), x)
    assert torch.equal(OP(x, cos, sin, z, interleaved=True), x)


def test_conventions_differ_by_a_permutation(device):
    """Interleaved on x equals half-split on x with features permuted (evens then odds)."""
    D = 16
    x = torch.randn(4, 3, D, dtype=torch.float64, device=device)
    cos, sin = tables(D, torch.float64, device)
    pos = torch.tensor([1, 7, 20, 49], device=device)
    perm = torch.cat((torch.arange(0, D, 2), torch.arange(1, D, 2))).to(device)
    inter = attn_ops.rotary_embedding(x, cos, sin, pos, interleaved=True)
    half = attn_ops.rotary_embedding(x[..., perm], cos, sin, pos, interleaved=False)
    torch.testing.assert_close(inter[..., perm], half, rtol=0, atol=1e-14)
    assert not torch.allclose(inter, attn_ops.rotary_embedding(x, cos, sin, pos))


@pytest.mark.parametrize("case", ["transposed", "sliced", "expanded", "packed_transposed",
                                  "packed_sliced", "odd_head_dim", "positions_transposed"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["halfsplit", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_forward_noncontiguous(case, interleaved, dtype, device):
    lead, H, D, rd = ((3, 6), 4, 24, 16)
    kind, pos_t = case, False
    if case.startswith("packed_"):
        lead, kind = (13,), case[len("packed_"):]
    elif case == "odd_head_dim":
        lead, H, D, rd, kind = (2, 5), 3, 13, 8, "transposed"
    elif case == "positions_transposed":
        kind, pos_t = "sliced", True
    x = make_x(kind, lead, H, D, dtype, device)
    assert not x.is_contiguous()
    x0 = x.clone()
    cos, sin = tables(rd, torch.float32, device)
    pos = make_positions(lead, torch.int64, device, transposed=pos_t)
    out = attn_ops.rotary_embedding(x, cos, sin, pos, interleaved=interleaved)
    assert torch.equal(x, x0)
    check_against_ref(out, x, cos, sin, pos, interleaved)
    # same values as for a contiguous copy of x
    assert torch.equal(out, attn_ops.rotary_embedding(x.contiguous(), cos, sin, pos,
                                                      interleaved=interleaved))


def test_empty_and_single_pair(device):
    cos, sin = tables(8, torch.float32, device)
    x = torch.randn(0, 2, 8, device=device)
    pos = torch.zeros(0, dtype=torch.int64, device=device)
    assert attn_ops.rotary_embedding(x, cos, sin, pos).shape == (0, 2, 8)
    attn_ops.rotary_embedding_(x, cos, sin, pos)
    # rotary_dim 2 (one pair) inside head_dim 5
    x = torch.randn(4, 3, 5, dtype=torch.float64, device=device)
    c, s = tables(2, torch.float64, device)
    pos = torch.tensor([0, 1, 2, 49], device=device)
    for inter in (False, True):
        check_against_ref(attn_ops.rotary_embedding(x, c, s, pos, interleaved=inter), x, c, s, pos,
                          inter)


# --------------------------------------------------------------------------------------------------
# inverse
# --------------------------------------------------------------------------------------------------
MANT = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23, torch.float64: 52}


@pytest.mark.parametrize("rotary", ["full", "partial"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["halfsplit", "interleaved"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_inverse(dtype, interleaved, rotary, device):
    lead, H, D, rd = SHAPES[("bthd", rotary)]
    x = make_x("contiguous", lead, H, D, dtype, device)
    # float64 tables for float64 x: with float32 tables cos^2 + sin^2 = 1 only to ~1e-7
    cos, sin = tables(rd, torch.float64 if dtype == torch.float64 else torch.float32, device)
    pos = make_positions(lead, torch.int32, device)
    y = OP(x, cos, sin, pos, interleaved=interleaved, inverse=True)
    check_against_ref(y, x, cos, sin, pos, interleaved, inverse=True, name="inverse")
    # inverse undoes the rotation (and the rotation undoes the inverse)
    fwd = OP(x, cos, sin, pos, interleaved=interleaved)
    back = OP(fwd, cos, sin, pos, interleaved=interleaved, inverse=True)
    back2 = OP(y, cos, sin, pos, interleaved=interleaved)
    atol = 4 * 2.0 ** -MANT[dtype] * x.abs().max().item()
    if dtype == torch.float32:
        atol = 1e-5 * x.abs().max().item()
    if dtype == torch.float64:
        atol = 1e-12
    for b in (back, back2):
        torch.testing.assert_close(b, x, rtol=0, atol=atol)
    assert torch.equal(back[..., rd:], x[..., rd:])
    # the in-place inverse equals the out-of-place one
    z = fwd.clone()
    OP_(z, cos, sin, pos, interleaved=interleaved, inverse=True)
    assert torch.equal(z, back)


# --------------------------------------------------------------------------------------------------
# In place
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rotary", ["full", "partial"])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced", "packed_transposed"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["halfsplit", "interleaved"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_inplace_equals_out_of_place(dtype, interleaved, layout, rotary, device):
    lead, H, D = (2, 6), 3, 24
    rd = 24 if rotary == "full" else 10
    kind = layout
    if layout == "packed_transposed":
        lead, kind = (9,), "transposed"
    x = make_x(kind, lead, H, D, dtype, device)
    base = x._base if x._base is not None else x
    cos, sin = tables(rd, dtype if dtype == torch.bfloat16 else torch.float32, device)
    pos = make_positions(lead, torch.int32 if dtype == torch.float16 else torch.int64, device)
    expected = attn_ops.rotary_embedding(x, cos, sin, pos, interleaved=interleaved)
    base_before = base.clone()
    ptr, strides = x.data_ptr(), x.stride()
    ret = attn_ops.rotary_embedding_(x, cos, sin, pos, interleaved=interleaved)
    assert ret is None
    assert x.data_ptr() == ptr and x.stride() == strides
    assert torch.equal(x, expected), "in-place result differs from the out-of-place one"
    # written through the view: the underlying buffer holds the result ...
    if layout == "transposed":
        assert torch.equal(base, expected.transpose(1, 2))
    elif layout == "packed_transposed":
        assert torch.equal(base, expected.transpose(0, 1))
    elif layout == "sliced":
        # ... and nothing outside the view was touched
        assert torch.equal(base[..., :D], expected)
        assert torch.equal(base[..., D:], base_before[..., D:])
    # the tail past rotary_dim is untouched
    assert torch.equal(x[..., rd:], (base_before.transpose(1, 2) if layout == "transposed" else
                                     base_before.transpose(0, 1) if layout == "packed_transposed"
                                     else base_before[..., :D])[..., rd:])


def test_inplace_through_torch_ops(device):
    x = torch.randn(2, 5, 4, 16, device=device)
    cos, sin = tables(16, torch.float32, device)
    pos = make_positions((2, 5), torch.int64, device)
    y = x.clone()
    assert OP_(y, cos, sin, pos, interleaved=True) is None
    assert torch.equal(y, OP(x, cos, sin, pos, interleaved=True))


# --------------------------------------------------------------------------------------------------
# Gradients
# --------------------------------------------------------------------------------------------------
def leaf(t, dtype=None):
    x = t.detach() if dtype is None or dtype == t.dtype else t.detach().to(dtype)
    return x.requires_grad_()


GC_CASES = {
    # name: (layout, lead, H, D, rd, table dtype)
    "bthd_full": ("contiguous", (2, 3), 2, 8, 8, torch.float64),
    "bthd_partial_transposed": ("transposed", (2, 3), 2, 10, 6, torch.float64),
    "packed_partial_sliced_table_f32": ("sliced", (5,), 3, 7, 4, torch.float32),
}


@pytest.mark.parametrize("inverse", [False, True], ids=["fwd", "inverse"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["halfsplit", "interleaved"])
@pytest.mark.parametrize("case", list(GC_CASES))
def test_gradcheck(case, interleaved, inverse, device):
    kind, lead, H, D, rd, tdt = GC_CASES[case]
    x = leaf(make_x(kind, lead, H, D, torch.float64, device))
    cos, sin = tables(rd, tdt, device, max_pos=12)
    pos = make_positions(lead, torch.int32, device, max_pos=12)
    f = lambda x: OP(x, cos, sin, pos, interleaved=interleaved, inverse=inverse)
    assert gradcheck(f, (x,))
    # expanded (stride 0) gradients, as from x.sum()
    assert gradcheck(lambda x: f(x).sum(), (x,))
    assert gradcheck(lambda x: f(x)[..., :rd].mean(), (x,))


@pytest.mark.parametrize("grad_kind", ["sum", "expand_heads", "transposed", "strided_last"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["halfsplit", "interleaved"])
def test_grad_unusual_grad_outputs(grad_kind, interleaved, device):
    """Gradients that are expanded (x.sum()), non-contiguous, or stride-2 in the last dim."""
    B, T, H, D, rd = 2, 5, 3, 12, 8
    x = torch.randn(B, T, H, D, dtype=torch.float64, device=device)
    cos, sin = tables(rd, torch.float64, device)
    pos = make_positions((B, T), torch.int64, device)
    if grad_kind == "sum":
        g = torch.ones((), dtype=torch.float64, device=device).expand(B, T, H, D)
    elif grad_kind == "expand_heads":
        g = torch.randn(B, T, 1, D, dtype=torch.float64, device=device).expand(B, T, H, D)
    elif grad_kind == "transposed":
        g = torch.randn(B, H, T, D, dtype=torch.float64, device=device).transpose(1, 2)
    else:
        g = torch.randn(B, T, H, 2 * D, dtype=torch.float64, device=device)[..., ::2]
    xs = leaf(x)
    (ours,) = torch.autograd.grad(OP(xs, cos, sin, pos, interleaved=interleaved), xs, g)
    xr = leaf(x)
    (ref,) = torch.autograd.grad(rope_ref(xr, cos, sin, pos, interleaved=interleaved), xr, g)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)
    if grad_kind == "sum":
        xs = leaf(x)
        (ours_sum,) = torch.autograd.grad(OP(xs, cos, sin, pos, interleaved=interleaved).sum(), xs)
        torch.testing.assert_close(ours_sum, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("inverse", [False, True], ids=["fwd", "inverse"])
@pytest.mark.parametrize("rotary", ["full", "partial"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["halfsplit", "interleaved"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_grad_matches_reference(dtype, interleaved, rotary, inverse, device):
    lead, H, D, rd = SHAPES[("packed" if inverse else "bthd", rotary)]
    x = make_x("transposed" if rotary == "partial" else "contiguous", lead, H, D, dtype, device)
    cos, sin = tables(rd, torch.float32, device)
    pos = make_positions(lead, torch.int64, device)
    g = torch.randn(x.shape, dtype=dtype, device=device)
    xs = leaf(x)
    out = OP(xs, cos, sin, pos, interleaved=interleaved, inverse=inverse)
    (ours,) = torch.autograd.grad(out, xs, g)
    assert ours.shape == x.shape and ours.dtype == dtype and ours.device == x.device
    grads = []
    for cdt in (torch.float64, dtype):
        xr = leaf(x, cdt)
        r = rope_ref(xr, cos, sin, pos, interleaved=interleaved, inverse=inverse, compute_dtype=cdt)
        grads.append(torch.autograd.grad(r, xr, g.to(cdt))[0])
    assert_close_to_ref(ours, grads[0], grads[1], name="dx")
    # the backward is the inverse rotation of g, computed in float32 and rounded once (a 1% error passed the
    # rule above in bfloat16)
    assert_rounded_once(ours, grads[0], g, name="dx")
    assert torch.equal(ours[..., rd:], g[..., rd:])


def test_no_grad_for_tables(device):
    """Only x is differentiable: tables / positions without grad, x's grad flows."""
    x = torch.randn(3, 2, 8, dtype=torch.float64, device=device, requires_grad=True)
    cos, sin = tables(8, torch.float64, device)
    pos = torch.tensor([3, 0, 7], device=device)
    out = attn_ops.rotary_embedding(x, cos, sin, pos)
    assert out.requires_grad and out.grad_fn is not None
    out.square().sum().backward()
    # a rotation preserves norms: d/dx sum(out^2) = 2 x
    torch.testing.assert_close(x.grad, 2 * x.detach(), rtol=0, atol=1e-12)


# --------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------
FNS = ["rotary_embedding", "rotary_embedding_"]
X_SHAPE, POS_SHAPE, TABLE = (2, 5, 4, 64), (2, 5), (4096, 32)


def err_args(device="cpu", x=X_SHAPE, pos=POS_SHAPE, table=TABLE, dtype=torch.float32,
             table_dtype=torch.float32, pos_dtype=torch.int64):
    xs = torch.randn(x, device=device).to(dtype)
    cos = torch.rand(table, device=device).to(table_dtype)
    sin = torch.rand(table, device=device).to(table_dtype)
    p = torch.randint(0, table[0] if len(table) else 1, pos, device=device).to(pos_dtype)
    return xs, cos, sin, p


def _raises(fn, pattern, x, cos, sin, pos, **kw):
    """The op raises RuntimeError matching "attn_ops.<fn>: " + pattern; a rejected in-place call
    leaves x (and the buffer it views) unchanged."""
    expect_error(fn, pattern, x, cos, sin, pos, written=(x,), regex=True, **kw)


def raises(fn, msg, *args, **kw):
    _raises(fn, re.escape(msg), *args, **kw)


@pytest.mark.parametrize("fn", FNS)
def test_error_x_dtype(fn, device):
    for bad in (torch.int32, torch.int64, torch.bool, torch.uint8):
        x, cos, sin, pos = err_args(device)
        raises(fn, f"x must be float16, bfloat16, float32 or float64, got {dtype_id(bad)}",
               (x.abs() * 10).to(bad), cos, sin, pos)


@pytest.mark.parametrize("fn", FNS)
def test_error_x_rank(fn, device):
    x, cos, sin, pos = err_args(device, x=(8,), pos=())
    raises(fn, "x must have at least 2 dimensions [..., heads, head_dim], got a 1-D tensor of shape "
               "[8]", x, cos, sin, pos)
    x, cos, sin, pos = err_args(device, x=(), pos=())
    raises(fn, "x must have at least 2 dimensions [..., heads, head_dim], got a 0-D tensor of shape "
               "[]", x, cos, sin, pos)


@pytest.mark.parametrize("fn", FNS)
def test_error_x_too_many_dims(fn, device):
    x, cos, sin, pos = err_args(device, x=(1, 1, 1, 1, 1, 1, 2, 3, 8), pos=(1, 1, 1, 1, 1, 1, 2))
    raises(fn, "x must have at most 8 dimensions [..., heads, head_dim], got a 9-D tensor of shape "
               "[1, 1, 1, 1, 1, 1, 2, 3, 8]", x, cos, sin, pos)


@pytest.mark.parametrize("fn", FNS)
def test_error_x_last_dim_stride(fn, device):
    _, cos, sin, pos = err_args(device)
    x = torch.randn(2, 5, 4, 128, device=device)[..., ::2]
    raises(fn, "x must have stride 1 in its last dimension, got stride 2", x, cos, sin, pos)
    x = torch.randn(2, 5, 64, 4, device=device).transpose(-1, -2)
    raises(fn, "x must have stride 1 in its last dimension, got stride 4", x, cos, sin, pos)


@pytest.mark.parametrize("fn", FNS)
def test_error_positions_shape_dtype(fn, device):
    x, cos, sin, _ = err_args(device)
    pos = torch.zeros(2, 4, dtype=torch.int64, device=device)
    raises(fn, "positions must be an int32 or int64 tensor of shape [2, 5] (the leading dims of x), "
               "got int64 tensor of shape [2, 4]", x, cos, sin, pos)
    pos = torch.zeros(2, 5, device=device)
    raises(fn, "positions must be an int32 or int64 tensor of shape [2, 5] (the leading dims of x), "
               "got float32 tensor of shape [2, 5]", x, cos, sin, pos)
    pos = torch.zeros(2, 5, dtype=torch.int16, device=device)
    raises(fn, "positions must be an int32 or int64 tensor of shape [2, 5] (the leading dims of x), "
               "got int16 tensor of shape [2, 5]", x, cos, sin, pos)
    x, cos, sin, _ = err_args(device, x=(10, 4, 64))
    pos = torch.zeros(2, 5, dtype=torch.int32, device=device)
    raises(fn, "positions must be an int32 or int64 tensor of shape [10] (the leading dims of x), "
               "got int32 tensor of shape [2, 5]", x, cos, sin, pos)


@pytest.mark.parametrize("fn", FNS)
def test_error_cos_rank_dtype(fn, device):
    what = "cos must be a 2-D tensor [max_positions, rotary_dim / 2] of dtype float32 or "
    x, cos, sin, pos = err_args(device, dtype=torch.bfloat16)
    raises(fn, what + "bfloat16 (as x), got ", x, cos.half(), sin.half(), pos)
    raises(fn, what + "bfloat16 (as x), got ", x, cos.double(), sin.double(), pos)
    raises(fn, what + "bfloat16 (as x), got ", x, cos[None], sin[None], pos)
    raises(fn, what + "bfloat16 (as x), got ", x, cos[:, 0], sin[:, 0], pos)
    x, cos, sin, pos = err_args(device, dtype=torch.float16)
    raises(fn, what + "float16 (as x), got ", x, cos.bfloat16(), sin.bfloat16(), pos)
    x, cos, sin, pos = err_args(device)  # float32 x: a float64 table is rejected
    raises(fn, what, x, cos.double(), sin.double(), pos)


@pytest.mark.parametrize("fn", FNS)
def test_error_sin_shape_dtype(fn, device):
    x, cos, sin, pos = err_args(device)
    raises(fn, "sin must have the shape and dtype of cos ([4096, 32] float32), got ",
           x, cos, sin[:, :16], pos)
    raises(fn, "sin must have the shape and dtype of cos ([4096, 32] float32), got ",
           x, cos, sin[:100], pos)
    raises(fn, "sin must have the shape and dtype of cos ([4096, 32] float32), got ",
           x, cos, sin.double(), pos)
    x, cos, sin, pos = err_args(device, dtype=torch.bfloat16)
    raises(fn, "sin must have the shape and dtype of cos ([4096, 32] float32), got ",
           x, cos, sin.bfloat16(), pos)


@pytest.mark.parametrize("fn", FNS)
def test_error_device_meta(fn):
    msg = re.escape("cos, sin and positions must be on the same device as x (cpu), got ") + ".*meta"
    x, cos, sin, pos = err_args("cpu")
    _raises(fn, msg, x, cos.to("meta"), sin, pos)
    _raises(fn, msg, x, cos, sin.to("meta"), pos)
    _raises(fn, msg, x, cos, sin, pos.to("meta"))
    _raises(fn, msg, x, cos.to("meta"), sin.to("meta"), pos.to("meta"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
@pytest.mark.parametrize("fn", FNS)
def test_error_device_cuda(fn):
    msg = re.escape("cos, sin and positions must be on the same device as x (cpu), got ") + ".*cuda"
    x, cos, sin, pos = err_args("cpu")
    _raises(fn, msg, x, cos.cuda(), sin, pos)
    _raises(fn, msg, x, cos, sin, pos.cuda())
    x, cos, sin, pos = err_args("cuda")
    _raises(fn, re.escape("cos, sin and positions must be on the same device as x (cuda"),
            x, cos.cpu(), sin.cpu(), pos)


@pytest.mark.parametrize("fn", FNS)
def test_error_rotary_dim_exceeds_head_dim(fn, device):
    x, cos, sin, pos = err_args(device, table=(4096, 40))
    raises(fn, "rotary_dim 2 * 40 = 80 exceeds head_dim 64", x, cos, sin, pos)
    x, cos, sin, pos = err_args(device, x=(7, 2, 9), pos=(7,), table=(16, 5))
    raises(fn, "rotary_dim 2 * 5 = 10 exceeds head_dim 9", x, cos, sin, pos)


@pytest.mark.host_value_check
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64], ids=dtype_id)
@pytest.mark.parametrize("fn", FNS)
def test_error_position_out_of_range(fn, pos_dtype, device):
    x, cos, sin, pos = err_args(device, pos_dtype=pos_dtype)
    pos[1, 3] = 4096
    raises(fn, "positions[1, 3] = 4096 is out of range [0, 4096) of the cos/sin table",
           x, cos, sin, pos)
    pos[1, 3] = 0
    pos[0, 0] = -1
    raises(fn, "positions[0, 0] = -1 is out of range [0, 4096) of the cos/sin table",
           x, cos, sin, pos)
    # only the last token is bad: still nothing is written
    pos[0, 0] = 0
    pos[1, 4] = 10 ** 6
    raises(fn, "positions[1, 4] = 1000000 is out of range [0, 4096) of the cos/sin table",
           x, cos, sin, pos)
    # packed, through a transposed view of x
    x, cos, sin, pos = err_args(device, x=(4, 9, 64), pos=(9,), table=(100, 16), pos_dtype=pos_dtype)
    x = x.transpose(0, 1)
    pos[7] = 100
    raises(fn, "positions[7] = 100 is out of range [0, 100) of the cos/sin table", x, cos, sin, pos)


# --------------------------------------------------------------------------------------------------
# opcheck
# --------------------------------------------------------------------------------------------------
def opcheck_inputs(name, device, requires_grad):
    # name: (layout, lead, H, D, rd, dtype, table dtype, pos dtype, kwargs)
    layout, lead, H, D, rd, dtype, tdt, pdt, kw = {
        "bthd_f32": ("contiguous", (2, 5), 3, 16, 16, torch.float32, torch.float32, torch.int64, {}),
        "packed_bf16_partial_interleaved": ("contiguous", (7,), 2, 24, 8, torch.bfloat16,
                                            torch.float32, torch.int32, dict(interleaved=True)),
        "transposed_f64_inverse": ("transposed", (2, 4), 2, 12, 10, torch.float64, torch.float64,
                                   torch.int32, dict(inverse=True)),
        "sliced_f16_table_f16": ("sliced", (3, 3), 2, 8, 8, torch.float16, torch.float16,
                                 torch.int64, dict(interleaved=True, inverse=False)),
    }[name]
    x = make_x(layout, lead, H, D, dtype, device)
    if requires_grad:
        x = x.detach().requires_grad_()
    cos, sin = tables(rd, tdt, device, max_pos=20)
    pos = make_positions(lead, pdt, device, max_pos=20)
    return (x, cos, sin, pos), kw


@pytest.mark.parametrize("case", ["bthd_f32", "packed_bf16_partial_interleaved",
                                  "transposed_f64_inverse", "sliced_f16_table_f16"])
def test_opcheck_rotary_embedding(case, device):
    args, kw = opcheck_inputs(case, device, requires_grad=case != "sliced_f16_table_f16")
    opcheck(OP.default, args, kw)


@pytest.mark.parametrize("case", ["bthd_f32", "packed_bf16_partial_interleaved",
                                  "transposed_f64_inverse"])
def test_opcheck_rotary_embedding_(case, device):
    args, kw = opcheck_inputs(case, device, requires_grad=False)
    opcheck(OP_.default, args, kw)


# --------------------------------------------------------------------------------------------------
# torch.compile
# --------------------------------------------------------------------------------------------------
def rope_fn(q, k, cos, sin, pos):
    """Training-style rotation of q (out of place) and inference-style rotation of k (in place)."""
    q_rot = attn_ops.rotary_embedding(q, cos, sin, pos)
    attn_ops.rotary_embedding_(k, cos, sin, pos, interleaved=True)
    return q_rot * 2.0 + k.sum(dim=2, keepdim=True)


def _compile_inputs(device):
    B, T, H, D, rd = 2, 6, 4, 32, 16
    q = torch.randn(B, T, H, D, device=device)
    k_base = torch.randn(B, H, T, D, device=device)  # k is a [B, T, H, D] view of it
    cos, sin = tables(rd, torch.float32, device)
    pos = make_positions((B, T), torch.int64, device)
    return q, k_base, cos, sin, pos


def test_dynamo_explain_no_graph_break(device):
    q, k_base, cos, sin, pos = _compile_inputs(device)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(rope_fn)(q, k_base.clone().transpose(1, 2), cos, sin, pos)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_compile_fullgraph_matches_eager(device):
    torch._dynamo.reset()
    compiled = torch.compile(rope_fn, fullgraph=True)
    q, k_base, cos, sin, pos = _compile_inputs(device)
    for step in range(2):  # new position values on the second call: nothing baked in
        if step == 1:
            pos = make_positions(tuple(pos.shape), torch.int64, device)
            pos[0, 0] = 3
        results = []
        for fn in (rope_fn, compiled):
            kb = k_base.clone()
            k = kb.transpose(1, 2)
            ptr = k.data_ptr()
            qs = q.detach().requires_grad_()
            out = fn(qs, k, cos, sin, pos)
            (dq,) = torch.autograd.grad((out * out).sum(), qs)
            assert k.data_ptr() == ptr, "the in-place op moved x's storage"
            results.append((out.detach(), kb, dq))
        (eo, ek, eg), (co, ck, cg) = results
        torch.testing.assert_close(co, eo, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(cg, eg, rtol=1e-5, atol=1e-5)
        # the in-place rotation reached k's buffer, with the eager values
        assert torch.equal(ck, ek)
        assert not torch.equal(ck, k_base)
        expected_k = attn_ops.rotary_embedding(k_base.transpose(1, 2), cos, sin, pos,
                                               interleaved=True)
        assert torch.equal(ck.transpose(1, 2), expected_k)
