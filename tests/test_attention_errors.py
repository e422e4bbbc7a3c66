"""Bad-input tests: every error message of docs/attention_api.md, for attention and
attention_backward, plus nasty inputs, each stated valid (the reference's values and gradients) or
invalid (its documented message); never a crash: they are first run in a child process, so a crash
fails only its own case.
"""

import re

import pytest
import torch

import attn_ops
import crash_isolation
from error_helpers import expect_error, rand, strided
from reference import assert_attention_close_to_ref, assert_close_to_ref, cu_seqlens, ref_kwargs
from test_attention_backward import ref_grads, same_dtype_grads

FNS = ["attention", "attention_backward"]

DENSE_Q, DENSE_K, DENSE_V = (2, 5, 8, 64), (2, 7, 4, 64), (2, 7, 4, 64)
VAR_Q, VAR_K, VAR_V = (12, 8, 64), (7, 4, 64), (7, 4, 64)
CU_Q, CU_K = [0, 5, 12], [0, 3, 7]


def qkv(device="cpu", q=DENSE_Q, k=DENSE_K, v=DENSE_V, dtype=torch.float32):
    return rand(q, dtype, device), rand(k, dtype, device), rand(v, dtype, device)


def varlen(device="cpu", q=VAR_Q, k=VAR_K, v=VAR_V, cu_q=CU_Q, cu_k=CU_K, dtype=torch.float32):
    kw = dict(cu_seqlens_q=torch.tensor(cu_q, dtype=torch.int32, device=device),
              cu_seqlens_k=torch.tensor(cu_k, dtype=torch.int32, device=device))
    return (*qkv(device, q, k, v, dtype), kw)


def bwd_extras(q, v, kw):
    """dout, out, lse consistent with q/v (so that only the tested argument is wrong)."""
    dt = q.dtype
    ldt = torch.float64 if dt == torch.float64 else torch.float32
    if kw.get("cu_seqlens_q") is not None and q.dim() == 3:
        out_shape, lse_shape = (q.shape[0], q.shape[1], v.shape[-1]), (q.shape[1], q.shape[0])
    elif q.dim() == 4:
        out_shape = (q.shape[0], q.shape[1], q.shape[2], v.shape[-1])
        lse_shape = (q.shape[0], q.shape[2], q.shape[1])
    else:
        out_shape, lse_shape = tuple(q.shape), (1,)
    return rand(out_shape, dt, q.device), rand(out_shape, dt, q.device), rand(lse_shape, ldt, q.device)


def call(fn, q, k, v, dout=None, out=None, lse=None, **kw):
    if fn == "attention":
        return attn_ops.attention(q, k, v, **kw)
    d, o, l = bwd_extras(q, v, kw)
    dout = d if dout is None else dout
    out = o if out is None else out
    lse = l if lse is None else lse
    return attn_ops.attention_backward(dout, q, k, v, out, lse, **kw)


def raises(fn, msg, *args, **kw):
    expect_error(fn, msg, fn, *args, call=call, **kw)


def raises_re(fn, pattern, *args, **kw):
    expect_error(fn, pattern, fn, *args, call=call, regex=True, **kw)


# --------------------------------------------------------------------------------------------------
# Ranks
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", FNS)
def test_q_must_be_4d(fn, device):
    raises(fn, "q must be a 4-D tensor [batch, seqlen_q, heads_q, head_dim_qk], "
               "got a 3-D tensor of shape [2, 5, 64]", *qkv(device, q=(2, 5, 64)))


@pytest.mark.parametrize("fn", FNS)
def test_k_v_must_be_4d(fn, device):
    raises(fn, "k must be a 4-D tensor [batch, seqlen_k, heads_kv, head_dim_qk], "
               "got a 3-D tensor of shape [2, 7, 64]", *qkv(device, k=(2, 7, 64)))
    raises(fn, "v must be a 4-D tensor [batch, seqlen_k, heads_kv, head_dim_v], "
               "got a 5-D tensor of shape [2, 7, 4, 64, 1]", *qkv(device, v=(2, 7, 4, 64, 1)))


@pytest.mark.parametrize("fn", FNS)
def test_varlen_q_must_be_3d(fn, device):
    q, k, v, kw = varlen(device, q=(2, 5, 8, 64))
    raises(fn, "q must be a 3-D tensor [total_q, heads_q, head_dim_qk] when cu_seqlens_q is "
               "given, got a 4-D tensor of shape [2, 5, 8, 64]", q, k, v, **kw)


@pytest.mark.parametrize("fn", FNS)
def test_varlen_k_v_must_be_3d(fn, device):
    q, k, v, kw = varlen(device, k=(1, 7, 4, 64))
    raises_re(fn, re.escape("k must be a 3-D tensor [total_k, heads_kv, head_dim_qk]") + ".*" +
              re.escape("got a 4-D tensor of shape [1, 7, 4, 64]"), q, k, v, **kw)
    q, k, v, kw = varlen(device, v=(7, 4))
    raises_re(fn, re.escape("v must be a 3-D tensor [total_k, heads_kv, head_dim_v]") + ".*" +
              re.escape("got a 2-D tensor of shape [7, 4]"), q, k, v, **kw)


@pytest.mark.parametrize("fn", FNS)
def test_cu_seqlens_given_together(fn, device):
    q, k, v, kw = varlen(device)
    raises(fn, "cu_seqlens_q and cu_seqlens_k must be given together, got only cu_seqlens_q",
           q, k, v, cu_seqlens_q=kw["cu_seqlens_q"])
    raises(fn, "cu_seqlens_q and cu_seqlens_k must be given together, got only cu_seqlens_k",
           q, k, v, cu_seqlens_k=kw["cu_seqlens_k"])


# --------------------------------------------------------------------------------------------------
# dtypes, devices, strides
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [torch.int32, torch.int64, torch.bool, torch.complex64],
                         ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("fn", FNS)
def test_q_dtype(fn, bad, device):
    q, k, v = (x.to(bad) for x in qkv(device))
    name = str(bad).replace("torch.", "")
    raises(fn, f"q must be float16, bfloat16, float32 or float64, got {name}", q, k, v)


@pytest.mark.parametrize("fn", FNS)
def test_k_v_dtype(fn, device):
    q, k, v = qkv(device)
    raises(fn, "k must have the same dtype as q (float32), got bfloat16", q, k.bfloat16(), v)
    raises(fn, "v must have the same dtype as q (float32), got float64", q, k, v.double())
    q, k, v = qkv(device, dtype=torch.float16)
    raises(fn, "k must have the same dtype as q (float16), got float32", q, k.float(), v)


@pytest.mark.parametrize("fn", FNS)
def test_device_mismatch_meta(fn):
    q, k, v = qkv("cpu")
    raises(fn, "k must be on the same device as q (cpu), got meta", q, k.to("meta"), v)
    raises(fn, "v must be on the same device as q (cpu), got meta", q, k, v.to("meta"))
    q, k, v, kw = varlen("cpu")
    raises(fn, "cu_seqlens_q must be on the same device as q (cpu), got meta", q, k, v,
           cu_seqlens_q=kw["cu_seqlens_q"].to("meta"), cu_seqlens_k=kw["cu_seqlens_k"])
    raises(fn, "cu_seqlens_k must be on the same device as q (cpu), got meta", q, k, v,
           cu_seqlens_q=kw["cu_seqlens_q"], cu_seqlens_k=kw["cu_seqlens_k"].to("meta"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
@pytest.mark.parametrize("fn", FNS)
def test_device_mismatch_cuda(fn):
    q, k, v = qkv("cpu")
    raises(fn, "k must be on the same device as q (cpu), got cuda", q, k.cuda(), v)
    raises(fn, "v must be on the same device as q (cpu), got cuda", q, k, v.cuda())
    q, k, v = qkv("cuda")
    raises(fn, "k must be on the same device as q (cuda", q, k.cpu(), v)
    q, k, v, kw = varlen("cuda")
    raises(fn, "cu_seqlens_q must be on the same device as q (cuda", q, k, v,
           cu_seqlens_q=kw["cu_seqlens_q"].cpu(), cu_seqlens_k=kw["cu_seqlens_k"])
    raises(fn, "cu_seqlens_k must be on the same device as q (cuda", q, k, v,
           cu_seqlens_q=kw["cu_seqlens_q"], cu_seqlens_k=kw["cu_seqlens_k"].cpu())


@pytest.mark.parametrize("fn", FNS)
def test_last_dim_stride(fn, device):
    q, k, v = qkv(device)
    raises(fn, "q must have stride 1 in its last dimension, got stride 2",
           strided(DENSE_Q, device), k, v)
    raises(fn, "k must have stride 1 in its last dimension, got stride 2",
           q, strided(DENSE_K, device), v)
    raises(fn, "v must have stride 1 in its last dimension, got stride 2",
           q, k, strided(DENSE_V, device))
    q, k, v, kw = varlen(device)
    raises(fn, "k must have stride 1 in its last dimension, got stride 2",
           q, strided(VAR_K, device), v, **kw)


def test_dout_out_stride(device):
    q, k, v = qkv(device)
    raises("attention_backward", "dout must have stride 1 in its last dimension, got stride 2",
           q, k, v, dout=strided((2, 5, 8, 64), device))
    raises("attention_backward", "out must have stride 1 in its last dimension, got stride 2",
           q, k, v, out=strided((2, 5, 8, 64), device))


# --------------------------------------------------------------------------------------------------
# Shapes
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", FNS)
def test_batch_size(fn, device):
    raises(fn, "k must have batch size 2 (as q), got 3", *qkv(device, k=(3, 7, 4, 64)))
    raises(fn, "v must have batch size 2 (as q), got 3", *qkv(device, v=(3, 7, 4, 64)))


@pytest.mark.parametrize("fn", FNS)
def test_v_seqlen(fn, device):
    raises(fn, "v must have seqlen_k 7 (as k), got 5", *qkv(device, v=(2, 5, 4, 64)))
    q, k, v, kw = varlen(device, v=(5, 4, 64))
    raises(fn, "v must have total_k 7 (as k), got 5", q, k, v, **kw)


@pytest.mark.parametrize("fn", FNS)
def test_v_heads(fn, device):
    raises(fn, "v must have heads_kv 4 (as k), got 2", *qkv(device, v=(2, 7, 2, 64)))
    q, k, v, kw = varlen(device, v=(7, 2, 64))
    raises(fn, "v must have heads_kv 4 (as k), got 2", q, k, v, **kw)


@pytest.mark.parametrize("fn", FNS)
def test_heads_at_least_one(fn, device):
    raises(fn, "heads_q and heads_kv must be at least 1, got heads_q 0, heads_kv 4",
           *qkv(device, q=(2, 5, 0, 64)))
    raises(fn, "heads_q and heads_kv must be at least 1, got heads_q 8, heads_kv 0",
           *qkv(device, k=(2, 7, 0, 64), v=(2, 7, 0, 64)))


@pytest.mark.parametrize("fn", FNS)
def test_heads_multiple(fn, device):
    raises(fn, "heads_q (6) must be a multiple of heads_kv (4)", *qkv(device, q=(2, 5, 6, 64)))
    q, k, v, kw = varlen(device, q=(12, 6, 64))
    raises(fn, "heads_q (6) must be a multiple of heads_kv (4)", q, k, v, **kw)


@pytest.mark.parametrize("fn", FNS)
def test_k_head_dim(fn, device):
    raises(fn, "k must have head_dim_qk 64 (as q), got 32", *qkv(device, k=(2, 7, 4, 32)))
    q, k, v, kw = varlen(device, k=(7, 4, 32))
    raises(fn, "k must have head_dim_qk 64 (as q), got 32", q, k, v, **kw)


@pytest.mark.parametrize("fn", FNS)
def test_head_dims_at_least_one(fn, device):
    raises(fn, "head_dim_qk and head_dim_v must be at least 1, got 0 and 64",
           *qkv(device, q=(2, 5, 8, 0), k=(2, 7, 4, 0)))
    raises(fn, "head_dim_qk and head_dim_v must be at least 1, got 64 and 0",
           *qkv(device, v=(2, 7, 4, 0)))


@pytest.mark.parametrize("fn", FNS)
def test_head_dims_at_most_1024(fn, device):
    raises(fn, "head_dim_qk and head_dim_v must be at most 1024, got 1025 and 64",
           *qkv(device, q=(1, 2, 2, 1025), k=(1, 3, 1, 1025), v=(1, 3, 1, 64)))
    raises(fn, "head_dim_qk and head_dim_v must be at most 1024, got 64 and 1025",
           *qkv(device, q=(1, 2, 2, 64), k=(1, 3, 1, 64), v=(1, 3, 1, 1025)))


# --------------------------------------------------------------------------------------------------
# Scalars
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", FNS)
def test_window_values(fn, device):
    raises(fn, "window_left must be >= -1 (-1 means unbounded), got -3", *qkv(device),
           window_left=-3)
    raises(fn, "window_right must be >= -1 (-1 means unbounded), got -2", *qkv(device),
           window_right=-2)


@pytest.mark.parametrize("fn", FNS)
def test_softcap_value(fn, device):
    raises(fn, "softcap must be 0 (disabled) or in [1.17549e-38, 3.40282e+38] "
           "(representable in float32, the accumulation type of this input dtype), got -1", *qkv(device), softcap=-1.0)


@pytest.mark.parametrize("fn", FNS)
def test_scale_finite(fn, device):
    raises(fn, "scale must be finite with |scale| <= 3.40282e+38 "
           "(representable in float32, the accumulation type of this input dtype), got inf",
           *qkv(device), scale=float("inf"))
    raises(fn, "scale must be finite with |scale| <= 3.40282e+38 "
           "(representable in float32, the accumulation type of this input dtype), got -inf",
           *qkv(device), scale=float("-inf"))
    raises_re(fn, re.escape("scale must be finite with |scale| <= 3.40282e+38 "
                            "(representable in float32, the accumulation type of this input dtype), got ")
              + "(?i:-?nan)", *qkv(device), scale=float("nan"))


# --------------------------------------------------------------------------------------------------
# cu_seqlens / max_seqlen
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", FNS)
def test_cu_seqlens_dtype(fn, device):
    q, k, v, kw = varlen(device)
    raises(fn, "cu_seqlens_q must be int32, got int64", q, k, v,
           cu_seqlens_q=kw["cu_seqlens_q"].long(), cu_seqlens_k=kw["cu_seqlens_k"])
    raises(fn, "cu_seqlens_k must be int32, got int64", q, k, v,
           cu_seqlens_q=kw["cu_seqlens_q"], cu_seqlens_k=kw["cu_seqlens_k"].long())
    raises(fn, "cu_seqlens_k must be int32, got float32", q, k, v,
           cu_seqlens_q=kw["cu_seqlens_q"], cu_seqlens_k=kw["cu_seqlens_k"].float())


@pytest.mark.parametrize("fn", FNS)
def test_cu_seqlens_shape(fn, device):
    q, k, v, kw = varlen(device)
    i32 = dict(dtype=torch.int32, device=device)
    raises(fn, "cu_seqlens_q must be a 1-D tensor of length batch + 1 >= 1, got shape [2, 3]",
           q, k, v, cu_seqlens_q=torch.tensor([CU_Q, CU_Q], **i32),
           cu_seqlens_k=kw["cu_seqlens_k"])
    raises(fn, "cu_seqlens_q must be a 1-D tensor of length batch + 1 >= 1, got shape [0]",
           q, k, v, cu_seqlens_q=torch.tensor([], **i32), cu_seqlens_k=kw["cu_seqlens_k"])
    raises(fn, "cu_seqlens_k must be a 1-D tensor of length batch + 1 >= 1, got shape [2, 3]",
           q, k, v, cu_seqlens_q=kw["cu_seqlens_q"],
           cu_seqlens_k=torch.tensor([CU_K, CU_K], **i32))


@pytest.mark.parametrize("fn", FNS)
def test_cu_seqlens_same_length(fn, device):
    q, k, v, kw = varlen(device, cu_k=[0, 3, 5, 7])
    raises(fn, "cu_seqlens_k must have the same length as cu_seqlens_q (3), got 4", q, k, v, **kw)


@pytest.mark.host_value_check
@pytest.mark.parametrize("fn", FNS)
def test_cu_seqlens_start(fn, device):
    q, k, v, kw = varlen(device, cu_q=[3, 5, 12])
    raises(fn, "cu_seqlens_q must start at 0, got 3", q, k, v, **kw)
    q, k, v, kw = varlen(device, cu_k=[1, 3, 7])
    raises(fn, "cu_seqlens_k must start at 0, got 1", q, k, v, **kw)


@pytest.mark.host_value_check
@pytest.mark.parametrize("fn", FNS)
def test_cu_seqlens_non_decreasing(fn, device):
    q, k, v, kw = varlen(device, cu_q=[0, 7, 5, 12], cu_k=[0, 3, 5, 7])
    raises(fn, "cu_seqlens_q must be non-decreasing, got cu_seqlens_q[2] = 5 after "
               "cu_seqlens_q[1] = 7", q, k, v, **kw)
    q, k, v, kw = varlen(device, cu_k=[0, 8, 7])
    raises(fn, "cu_seqlens_k must be non-decreasing, got cu_seqlens_k[2] = 7 after "
               "cu_seqlens_k[1] = 8", q, k, v, **kw)


@pytest.mark.host_value_check
@pytest.mark.parametrize("fn", FNS)
def test_cu_seqlens_end(fn, device):
    q, k, v, kw = varlen(device, cu_q=[0, 5, 10])
    raises(fn, "cu_seqlens_q must end at the number of tokens in q (12), got 10", q, k, v, **kw)
    q, k, v, kw = varlen(device, cu_k=[0, 3, 6])
    raises(fn, "cu_seqlens_k must end at the number of tokens in k (7), got 6", q, k, v, **kw)


@pytest.mark.parametrize("fn", FNS)
def test_max_seqlen_only_with_cu_seqlens(fn, device):
    raises(fn, "max_seqlen_q must be given only with cu_seqlens_q", *qkv(device), max_seqlen_q=5)
    raises(fn, "max_seqlen_k must be given only with cu_seqlens_k", *qkv(device), max_seqlen_k=7)


@pytest.mark.host_value_check
@pytest.mark.parametrize("fn", FNS)
def test_max_seqlen_too_small(fn, device):
    q, k, v, kw = varlen(device, cu_q=[0, 6, 12])
    raises(fn, "max_seqlen_q (4) is smaller than the longest sequence in cu_seqlens_q (6)",
           q, k, v, max_seqlen_q=4, **kw)
    q, k, v, kw = varlen(device)
    raises(fn, "max_seqlen_k (3) is smaller than the longest sequence in cu_seqlens_k (4)",
           q, k, v, max_seqlen_k=3, **kw)


# --------------------------------------------------------------------------------------------------
# attention_backward only
# --------------------------------------------------------------------------------------------------
BWD = "attention_backward"


def test_backward_dout_shape(device):
    raises(BWD, "dout must have shape [2, 5, 8, 64] (as out), got [2, 5, 8, 32]", *qkv(device),
           dout=rand((2, 5, 8, 32), device=device))


def test_backward_out_shape(device):
    raises(BWD, "out must have shape [2, 5, 8, 64], got [2, 5, 8, 32]", *qkv(device),
           out=rand((2, 5, 8, 32), device=device))
    q, k, v, kw = varlen(device)
    raises(BWD, "out must have shape [12, 8, 64], got [12, 8, 63]", q, k, v,
           out=rand((12, 8, 63), device=device), **kw)


def test_backward_dout_out_dtype(device):
    q, k, v = qkv(device, dtype=torch.bfloat16)
    raises(BWD, "dout must have the same dtype as q (bfloat16), got float32", q, k, v,
           dout=rand((2, 5, 8, 64), device=device))
    raises(BWD, "out must have the same dtype as q (bfloat16), got float32", q, k, v,
           out=rand((2, 5, 8, 64), device=device))


def test_backward_lse_shape_dtype(device):
    q, k, v = qkv(device)
    raises(BWD, "lse must have shape [2, 8, 5] and dtype float32, got shape [2, 8, 4] and dtype "
                "float32", q, k, v, lse=rand((2, 8, 4), device=device))
    raises(BWD, "lse must have shape [2, 8, 5] and dtype float32, got shape [2, 8, 5] and dtype "
                "float64", q, k, v, lse=rand((2, 8, 5), torch.float64, device))
    q, k, v = qkv(device, dtype=torch.bfloat16)
    raises(BWD, "lse must have shape [2, 8, 5] and dtype float32, got shape [2, 8, 5] and dtype "
                "bfloat16", q, k, v, lse=rand((2, 8, 5), torch.bfloat16, device))
    q, k, v = qkv(device, dtype=torch.float64)
    raises(BWD, "lse must have shape [2, 8, 5] and dtype float64, got shape [2, 8, 5] and dtype "
                "float32", q, k, v, lse=rand((2, 8, 5), torch.float32, device))
    q, k, v, kw = varlen(device)
    raises(BWD, "lse must have shape [8, 12] and dtype float32, got shape [12, 8] and dtype "
                "float32", q, k, v, lse=rand((12, 8), device=device), **kw)


def test_backward_dlse_shape_dtype(device):
    q, k, v = qkv(device)
    raises(BWD, "dlse must have shape [2, 8, 5] and dtype float32, got shape [2, 8, 4] and dtype "
                "float32", q, k, v, dlse=rand((2, 8, 4), device=device))
    raises(BWD, "dlse must have shape [2, 8, 5] and dtype float32, got shape [2, 8, 5] and dtype "
                "float16", q, k, v, dlse=rand((2, 8, 5), torch.float16, device))
    q, k, v, kw = varlen(device)
    raises(BWD, "dlse must have shape [8, 12] and dtype float32, got shape [8, 11] and dtype "
                "float32", q, k, v, dlse=rand((8, 11), device=device), **kw)


def test_autograd_path_raises_same_message(device):
    q, k, v = qkv(device, k=(2, 7, 4, 32))
    q.requires_grad_()
    expect_error("attention", "k must have head_dim_qk 64 (as q), got 32", q, k, v)
    expect_error("attention", "window_left must be >= -1 (-1 means unbounded), got -3", q, *qkv(device)[1:],
                 call=torch.ops.attn_ops.attention, window_left=-3)


# --------------------------------------------------------------------------------------------------
# Nasty inputs: each is either valid (the reference's values, gradients included) or invalid (its
# documented message), never a crash
# --------------------------------------------------------------------------------------------------
def valid(q, k, v, backward=False, **kw):
    """A documented-valid input: the op must not raise; out / lse match the float64 reference with
    the tolerance rule and, with `backward`, attention_backward (through out and lse) matches autograd
    through it (gradients computed in float32 from the same inputs, rounded once, as baseline)."""
    out, lse = attn_ops.attention(q, k, v, **kw)
    assert_attention_close_to_ref((out, lse), (q, k, v), **ref_kwargs(kw))
    if backward:
        dout, dlse = torch.randn_like(out), torch.randn_like(lse)
        grads = attn_ops.attention_backward(dout, q, k, v, out, lse, dlse=dlse, **kw)
        if out.numel() + lse.numel():
            r64 = ref_grads(q, k, v, dout, dlse, torch.float64, **kw)
            same = same_dtype_grads(q, k, v, dout, dlse, **kw)
        else:  # no output element: every gradient is 0
            r64 = same = (None,) * 3
        for name, g, r, s, x in zip(("dq", "dk", "dv"), grads, r64, same, (q, k, v)):
            assert g.shape == x.shape and g.dtype == x.dtype
            # None: an input no output depends on (autograd's answer for an empty batch)
            r = torch.zeros_like(x, dtype=torch.float64) if r is None else r
            s = torch.zeros_like(x) if s is None else s
            assert_close_to_ref(g, r, s, name=name)
    return out, lse


def invalid(message, q, k, v, backward=False, **kw):
    """A documented-invalid input: attention (and, with `backward`, attention_backward) raise a
    RuntimeError with the documented message, which names the argument."""
    for fn in FNS if backward else FNS[:1]:
        raises(fn, message, q, k, v, **kw)


def _dense(B, Tq, Tk, Hq, Hkv, D, Dv=None, dtype=torch.float32):
    Dv = D if Dv is None else Dv
    return (torch.randn(B, Tq, Hq, D, dtype=dtype), torch.randn(B, Tk, Hkv, D, dtype=dtype),
            torch.randn(B, Tk, Hkv, Dv, dtype=dtype))


def _varlen(lens_q, lens_k, Hq=4, Hkv=2, D=16):
    return (torch.randn(sum(lens_q), Hq, D), torch.randn(sum(lens_k), Hkv, D),
            torch.randn(sum(lens_k), Hkv, D)), dict(cu_seqlens_q=cu_seqlens(lens_q),
                                                    cu_seqlens_k=cu_seqlens(lens_k))


def _huge_window(wl, wr, causal=False):
    q, k, v = _dense(2, 7, 9, 4, 2, 16)
    out, lse = valid(q, k, v, causal=causal, window_left=wl, window_right=wr, backward=True)
    # a huge window is the same as an unbounded one
    ref = attn_ops.attention(q, k, v, causal=causal, window_left=-1,
                             window_right=-1 if not causal else 0)
    torch.testing.assert_close(out, ref[0], rtol=1e-6, atol=1e-6)


def _varlen_valid(lens_q, lens_k, **kw):
    (q, k, v), cu = _varlen(lens_q, lens_k)
    valid(q, k, v, backward=True, **cu, **kw)


def _varlen_invalid(message, lens_q, lens_k, **kw):
    (q, k, v), cu = _varlen(lens_q, lens_k)
    invalid(message, q, k, v, backward=True, **cu, **kw)


def _noncontiguous_cu():
    (q, k, v), _ = _varlen([3, 4], [5, 2])
    cq = torch.tensor([0, 99, 3, 99, 7], dtype=torch.int32)[::2]
    ck = torch.tensor([0, 99, 5, 99, 7], dtype=torch.int32)[::2]
    valid(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, causal=True)


def _stride0_everywhere():
    q = torch.randn(1, 1, 1, 32).expand(2, 9, 4, 32)
    k = torch.randn(1, 1, 1, 32).expand(2, 11, 2, 32)
    v = torch.randn(1, 1, 1, 32).expand(2, 11, 2, 32)
    valid(q, k, v, causal=True, backward=True)


def _backward_empty(shape_q, shape_k):
    q, k, v = torch.randn(shape_q), torch.randn(shape_k), torch.randn(shape_k)
    valid(q, k, v, backward=True, causal=True)


SOFTCAP_RANGE = re.escape("softcap must be 0 (disabled) or in [1.17549e-38, 3.40282e+38] (representable "
                          "in float32, the accumulation type of this input dtype), got ")

NASTY = {
    "batch0": lambda: valid(*_dense(0, 5, 7, 4, 2, 16), backward=True),
    "tq0_tk0": lambda: valid(*_dense(2, 0, 0, 4, 2, 16), backward=True),
    "tq0": lambda: _backward_empty((2, 0, 4, 16), (2, 9, 2, 16)),
    "tk0": lambda: _backward_empty((2, 5, 4, 16), (2, 0, 2, 16)),
    "all_dims_zero": lambda: invalid("heads_q and heads_kv must be at least 1, got heads_q 0, heads_kv 0",
                                     *_dense(0, 0, 0, 0, 0, 0)),
    "heads0": lambda: invalid("heads_q and heads_kv must be at least 1, got heads_q 0, heads_kv 2",
                              *_dense(2, 5, 7, 0, 2, 16)),
    "head_dim0": lambda: invalid("head_dim_qk and head_dim_v must be at least 1, got 0 and 0",
                                 *_dense(2, 5, 7, 4, 2, 0)),
    "head_dim_1000": lambda: valid(*_dense(1, 3, 5, 2, 1, 1000), backward=True),
    "heads_64": lambda: valid(*_dense(1, 1, 3, 64, 64, 8), backward=True),
    "tq1000_tk1_causal": lambda: valid(*_dense(1, 1000, 1, 2, 1, 8), causal=True, backward=True),
    "window_2p62": lambda: _huge_window(2 ** 62, 2 ** 62),
    "window_int64_max": lambda: _huge_window(2 ** 63 - 1, 2 ** 63 - 1),
    "window_int32_overflow": lambda: _huge_window(2 ** 31, 2 ** 32 + 1),
    "window_huge_causal": lambda: _huge_window(2 ** 63 - 1, -1, causal=True),
    "scale_1e30": lambda: valid(*_dense(1, 5, 6, 2, 1, 8), scale=1e30),
    "softcap_tiny": lambda: valid(*_dense(1, 5, 6, 2, 1, 8), softcap=1e-30),
    # NaN is not in the range; it must not produce NaN outputs
    "softcap_nan": lambda: expect_error("attention", SOFTCAP_RANGE + "(?i:nan)", *_dense(1, 4, 4, 2, 1, 8),
                                        regex=True, softcap=float("nan")),
    "stride0_everywhere": _stride0_everywhere,
    "max_seqlen_negative": lambda: _varlen_invalid("max_seqlen_q must be >= 0, got -1", [3, 4], [5, 2],
                                                   max_seqlen_q=-1, max_seqlen_k=-5),
    "max_seqlen_negative_empty": lambda: _varlen_invalid("max_seqlen_q must be >= 0, got -1", [0, 0], [0, 0],
                                                         max_seqlen_q=-1, max_seqlen_k=-1),
    "max_seqlen_zero_empty": lambda: _varlen_valid([0, 0], [0, 0], max_seqlen_q=0, max_seqlen_k=0),
    "max_seqlen_huge": lambda: _varlen_valid([3, 4], [5, 2], max_seqlen_q=2 ** 40, max_seqlen_k=2 ** 62),
    "max_seqlen_int64_max": lambda: _varlen_valid([3, 4], [5, 2], max_seqlen_q=2 ** 63 - 1,
                                                  max_seqlen_k=2 ** 63 - 1),
    "varlen_batch0": lambda: _varlen_valid([], []),
    "varlen_all_empty": lambda: _varlen_valid([0, 0, 0], [0, 0, 0], causal=True),
    "cu_negative": lambda: invalid(
        "cu_seqlens_q must be non-decreasing, got cu_seqlens_q[1] = -3 after cu_seqlens_q[0] = 0",
        *_varlen([3, 4], [5, 2])[0], cu_seqlens_q=torch.tensor([0, -3, 7], dtype=torch.int32),
        cu_seqlens_k=cu_seqlens([5, 2])),
    "cu_int32_max": lambda: invalid(
        "cu_seqlens_q must be non-decreasing, got cu_seqlens_q[2] = 7 after cu_seqlens_q[1] = 2147483647",
        *_varlen([3, 4], [5, 2])[0],
        cu_seqlens_q=torch.tensor([0, 2 ** 31 - 1, 7], dtype=torch.int32),
        cu_seqlens_k=cu_seqlens([5, 2])),
    "cu_noncontiguous": _noncontiguous_cu,
}

@pytest.fixture(scope="module")
def crash_report():
    """Every case of NASTY run in child processes first: name -> None, or how the process died."""
    return crash_isolation.crash_report("test_attention_errors", "NASTY", NASTY, timeout=300)


@pytest.mark.parametrize("name", list(NASTY))
def test_nasty_inputs(name, crash_report):
    crash = crash_report.get(name)
    if crash is not None:
        pytest.fail(f"nasty input {name!r} crashed the process: {crash}")
    NASTY[name]()
