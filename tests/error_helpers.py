"""What the bad-input tests share: random inputs and one ``expect_error`` that asserts an op's exact
message and, for in-place ops, that a rejected call wrote nothing."""
import re

import pytest
import torch

import attn_ops


def rand(shape, dtype=torch.float32, device="cpu"):
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, dtype=dtype, device=device)
    return (torch.randn(shape, device=device) * 3).to(dtype)


def i32(x, device="cpu"):
    return torch.tensor(x, dtype=torch.int32, device=device)


def strided(shape, device="cpu", dtype=torch.float32):
    """A tensor of ``shape`` with stride 2 in its last dim."""
    x = torch.randn(*shape[:-1], shape[-1] * 2, dtype=dtype, device=device)[..., ::2]
    assert x.stride(-1) == 2 and tuple(x.shape) == tuple(shape)
    return x


def snapshot(*tensors):
    """(buffer, copy) of every buffer the tensors live in (meta tensors have no values)."""
    snap = []
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            continue
        base = t._base if t._base is not None else t
        snap.append((base, base.clone()))
    return snap


def assert_unchanged(snap):
    for base, before in snap:
        assert torch.equal(base, before), "a rejected call wrote into a cache"


def expect_error(op, message, *args, call=None, written=(), regex=False, anchored=False, exact=False,
                 **kwargs):
    """``call(*args, **kwargs)`` (default ``attn_ops.<op>``) raises a RuntimeError whose message holds
    ``attn_ops.<op>: `` + ``message`` (a regular expression when ``regex``; at the start of the
    message when ``anchored``; the whole first line of the message when ``exact``), and the whole
    buffers of the ``written`` tensors are bit-identical to before (a rejected in-place call writes
    nothing)."""
    snap = snapshot(*written)
    pattern = re.escape(f"attn_ops.{op}: ") + (message if regex else re.escape(message))
    with pytest.raises(RuntimeError, match=("^" if anchored or exact else "") + pattern) as info:
        (call or getattr(attn_ops, op))(*args, **kwargs)
    if exact:
        assert re.fullmatch(pattern, str(info.value).splitlines()[0]), str(info.value)
    assert_unchanged(snap)
