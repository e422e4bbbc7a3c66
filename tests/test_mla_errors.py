"""Bad-input tests for the MLA ops: every error message of docs/mla_api.md, and for every rejected
mla_cache_append a check that the whole buffer of the latent cache is bit-identical to before (a
rejected call writes nothing, even when only the last row / token is bad).

Inputs that could make a careless kernel write or read out of bounds (int32 overflow of lengths,
huge slots / block indices) are first run in a child process, so a crash fails only its own case.
"""

import re

import pytest
import torch

import attn_ops
import crash_isolation
from error_helpers import expect_error, i32, rand, strided

APP, DEC = "mla_cache_append", "mla_decode"

# mla_cache_append, contiguous: cache [B=2, capacity=16, 512 + 64], 3 new tokens, lengths [2, 5]
A_C, A_CKV, A_KPE, A_LENS = (2, 16, 576), (2, 3, 512), (2, 3, 64), [2, 5]
# mla_cache_append, paged: 6 blocks of 16 slots, 5 tokens
P_C, P_CKV, P_KPE, P_SLOTS = (6, 16, 576), (5, 512), (5, 64), [3, 17, -1, 40, 95]
# mla_decode: q_latent [2, 1, 16, 512], q_rope [.., 64]; contiguous cache capacity 32; paged 6 blocks
# of 16, block_table [2, 2]
Q_L, Q_R, D_C, D_PC, D_LENS, D_BT = (2, 1, 16, 512), (2, 1, 16, 64), (2, 32, 576), (6, 16, 576), \
    [5, 20], [[3, 0], [5, 1]]
SCALE = 192 ** -0.5


def raises(op, msg, *args, **kw):
    """The op raises RuntimeError with "attn_ops.<op>: " + msg and (append) leaves the cache untouched."""
    raises_re(op, re.escape(msg), *args, **kw)


def raises_re(op, pattern, *args, **kw):
    expect_error(op, pattern, *args, written=args[:1] if op == APP else (), regex=True, **kw)


def app(device="cpu", c=A_C, ckv=A_CKV, kpe=A_KPE, lens=A_LENS, dtype=torch.float32):
    """(args, kwargs) of a contiguous append."""
    return ((rand(c, dtype, device), rand(ckv, dtype, device), rand(kpe, dtype, device)),
            dict(cache_seqlens=i32(lens, device) if isinstance(lens, list) else lens))


def pag(device="cpu", c=P_C, ckv=P_CKV, kpe=P_KPE, slots=P_SLOTS, dtype=torch.float32,
        slot_dtype=torch.int32):
    return ((rand(c, dtype, device), rand(ckv, dtype, device), rand(kpe, dtype, device)),
            dict(slot_mapping=torch.tensor(slots, dtype=slot_dtype, device=device)))


def dec(device="cpu", ql=Q_L, qr=Q_R, c=D_C, lens=D_LENS, dtype=torch.float32, scale=SCALE):
    """(args, kwargs) of a decode over a contiguous cache."""
    return ((rand(ql, dtype, device), rand(qr, dtype, device), rand(c, dtype, device),
             i32(lens, device)), dict(scale=scale))


def pdec(device="cpu", ql=Q_L, qr=Q_R, c=D_PC, lens=D_LENS, bt=D_BT, dtype=torch.float32):
    args, kw = dec(device, ql, qr, c, lens, dtype)
    kw["block_table"] = i32(bt, device)
    return args, kw


# --------------------------------------------------------------------------------------------------
# mla_cache_append
# --------------------------------------------------------------------------------------------------
def test_append_exactly_one_index(device):
    msg = ("exactly one of cache_seqlens (contiguous cache) and slot_mapping (paged cache) must be "
           "given, got ")
    args, kw = app(device)
    raises(APP, msg + "both", *args, **kw, slot_mapping=i32([0, 1, 2], device))
    raises(APP, msg + "neither", *args)
    args, kw = pag(device)
    raises(APP, msg + "both", *args, **kw, cache_seqlens=i32([0, 0, 0, 0, 0, 0], device))
    raises(APP, msg + "neither", *args)


def test_append_cache_rank(device):
    raises(APP, "latent_cache must be a 3-D tensor [batch, capacity, kv_lora_rank + rope_dim], got "
                "a 4-D tensor of shape [2, 16, 1, 576]", *app(device, c=(2, 16, 1, 576))[0],
           **app(device)[1])
    args, kw = app(device, c=(32, 576))
    raises(APP, "latent_cache must be a 3-D tensor [batch, capacity, kv_lora_rank + rope_dim], got "
                "a 2-D tensor of shape [32, 576]", *args, **kw)
    args, kw = pag(device, c=(96, 576))
    raises(APP, "latent_cache must be a 3-D tensor [num_blocks, block_size, kv_lora_rank + "
                "rope_dim] when slot_mapping is given, got a 2-D tensor of shape [96, 576]",
           *args, **kw)
    args, kw = pag(device, c=(6, 16, 1, 576))
    raises(APP, "latent_cache must be a 3-D tensor [num_blocks, block_size, kv_lora_rank + "
                "rope_dim] when slot_mapping is given, got a 4-D tensor of shape [6, 16, 1, 576]",
           *args, **kw)


def test_append_c_kv_rank(device):
    args, kw = app(device, ckv=(6, 512))
    raises(APP, "c_kv must be a 3-D tensor [batch, seqlen_new, kv_lora_rank], got a 2-D tensor of "
                "shape [6, 512]", *args, **kw)
    args, kw = pag(device, ckv=(5, 1, 512))
    raises(APP, "c_kv must be a 2-D tensor [num_tokens, kv_lora_rank] when slot_mapping is given, "
                "got a 3-D tensor of shape [5, 1, 512]", *args, **kw)


def test_append_k_pe_rank(device):
    # no message of its own: k_pe's rank is part of "the leading dims of c_kv"
    args, kw = app(device, kpe=(6, 64))
    raises(APP, "k_pe must have shape [2, 3, *] (the leading dims of c_kv), got [6, 64]",
           *args, **kw)
    args, kw = pag(device, kpe=(5, 1, 64))
    raises(APP, "k_pe must have shape [5, *] (the leading dims of c_kv), got [5, 1, 64]",
           *args, **kw)


@pytest.mark.parametrize("bad", [torch.int32, torch.int64, torch.bool],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_append_cache_dtype(bad, device):
    name = str(bad).replace("torch.", "")
    raises(APP, f"latent_cache must be float16, bfloat16, float32, float64, float8_e4m3fn or float8_e5m2, "
                f"got {name}",
           *app(device, dtype=bad)[0], **app(device)[1])
    raises(APP, f"latent_cache must be float16, bfloat16, float32, float64, float8_e4m3fn or float8_e5m2, "
                f"got {name}",
           *pag(device, dtype=bad)[0], **pag(device)[1])


def test_append_same_dtype(device):
    (c, ckv, kpe), kw = app(device)
    raises(APP, "c_kv must have the same dtype as latent_cache (float32), got bfloat16",
           c, ckv.bfloat16(), kpe, **kw)
    raises(APP, "k_pe must have the same dtype as latent_cache (float32), got float16",
           c, ckv, kpe.half(), **kw)
    (c, ckv, kpe), kw = pag(device, dtype=torch.bfloat16)
    raises(APP, "c_kv must have the same dtype as latent_cache (bfloat16), got float32",
           c, ckv.float(), kpe, **kw)
    raises(APP, "k_pe must have the same dtype as latent_cache (bfloat16), got float64",
           c, ckv, kpe.double(), **kw)


def test_append_device_meta():
    (c, ckv, kpe), kw = app("cpu")
    raises(APP, "latent_cache, c_kv and k_pe must be on the same device, "
                "got latent_cache on cpu, c_kv on meta, k_pe on cpu",
           c, ckv.to("meta"), kpe, **kw)
    raises(APP, "latent_cache, c_kv and k_pe must be on the same device, "
                "got latent_cache on cpu, c_kv on cpu, k_pe on meta",
           c, ckv, kpe.to("meta"), **kw)
    raises(APP, "cache_seqlens must be on the same device as latent_cache (cpu), got meta",
           c, ckv, kpe, cache_seqlens=kw["cache_seqlens"].to("meta"))
    (c, ckv, kpe), kw = pag("cpu")
    raises(APP, "slot_mapping must be on the same device as latent_cache (cpu), got meta",
           c, ckv, kpe, slot_mapping=kw["slot_mapping"].to("meta"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_append_device_cuda():
    (c, ckv, kpe), kw = app("cpu")
    raises(APP, "c_kv must be on the same device as latent_cache (cpu), got cuda",
           c, ckv.cuda(), kpe, **kw)
    (c, ckv, kpe), kw = app("cuda")
    raises(APP, "cache_seqlens must be on the same device as latent_cache (cuda",
           c, ckv, kpe, cache_seqlens=kw["cache_seqlens"].cpu())
    raises(APP, "k_pe must be on the same device as latent_cache (cuda", c, ckv, kpe.cpu(), **kw)
    (c, ckv, kpe), kw = pag("cuda")
    raises(APP, "slot_mapping must be on the same device as latent_cache (cuda",
           c, ckv, kpe, slot_mapping=kw["slot_mapping"].cpu())


def test_append_last_dim_stride(device):
    (c, ckv, kpe), kw = app(device)
    raises(APP, "latent_cache must have stride 1 in its last dimension, got stride 2",
           strided(A_C, device), ckv, kpe, **kw)
    raises(APP, "c_kv must have stride 1 in its last dimension, got stride 2",
           c, strided(A_CKV, device), kpe, **kw)
    raises(APP, "k_pe must have stride 1 in its last dimension, got stride 2",
           c, ckv, strided(A_KPE, device), **kw)
    (c, ckv, kpe), kw = pag(device)
    raises(APP, "latent_cache must have stride 1 in its last dimension, got stride 2",
           strided(P_C, device), ckv, kpe, **kw)


def test_append_k_pe_shape(device):
    args, kw = app(device, kpe=(2, 4, 64))
    raises(APP, "k_pe must have shape [2, 3, *] (the leading dims of c_kv), got [2, 4, 64]",
           *args, **kw)
    args, kw = app(device, kpe=(3, 3, 64))
    raises(APP, "k_pe must have shape [2, 3, *] (the leading dims of c_kv), got [3, 3, 64]",
           *args, **kw)
    args, kw = pag(device, kpe=(4, 64))
    raises(APP, "k_pe must have shape [5, *] (the leading dims of c_kv), got [4, 64]", *args, **kw)


def test_append_last_dim(device):
    msg = ("latent_cache must have last dim kv_lora_rank + rope_dim = 512 + 64 = 576 (from c_kv and "
           "k_pe), got ")
    raises(APP, msg + "560", *app(device, c=(2, 16, 560))[0], **app(device)[1])
    raises(APP, msg + "512", *pag(device, c=(6, 16, 512))[0], **pag(device)[1])
    # the split d_c + d_rope is read from c_kv and k_pe, not from the cache
    args, kw = app(device, ckv=(2, 3, 32), kpe=(2, 3, 16))
    raises(APP, "latent_cache must have last dim kv_lora_rank + rope_dim = 32 + 16 = 48 (from c_kv "
                "and k_pe), got 576", *args, **kw)


def test_append_batch_size(device):
    args, kw = app(device, ckv=(3, 3, 512), kpe=(3, 3, 64))
    raises(APP, "c_kv must have batch size 2 (as latent_cache), got 3", *args, **kw)


def test_append_seqlens_dtype_shape(device):
    (c, ckv, kpe), kw = app(device)
    sl = kw["cache_seqlens"]
    msg = "cache_seqlens must be an int32 tensor of shape [2], got "
    raises(APP, msg + "int64 tensor of shape [2]", c, ckv, kpe, cache_seqlens=sl.long())
    raises(APP, msg + "float32 tensor of shape [2]", c, ckv, kpe, cache_seqlens=sl.float())
    raises(APP, msg + "int32 tensor of shape [3]", c, ckv, kpe, cache_seqlens=i32([2, 5, 1], device))
    raises(APP, msg + "int32 tensor of shape [2, 1]", c, ckv, kpe, cache_seqlens=sl.reshape(2, 1))


@pytest.mark.host_value_check
def test_append_seqlens_negative(device):
    raises(APP, "cache_seqlens[1] = -1 must be >= 0", *app(device)[0], **app(device, lens=[2, -1])[1])
    raises(APP, "cache_seqlens[0] = -5 must be >= 0", *app(device)[0], **app(device, lens=[-5, 2])[1])


@pytest.mark.host_value_check
def test_append_exceeds_capacity(device):
    # row 0 is valid: a kernel that writes row by row while checking would have written it
    raises(APP, "cache_seqlens[1] = 14 plus 3 new tokens exceeds the cache capacity 16",
           *app(device)[0], **app(device, lens=[2, 14])[1])
    raises(APP, "cache_seqlens[1] = 16 plus 3 new tokens exceeds the cache capacity 16",
           *app(device)[0], **app(device, lens=[13, 16])[1])
    args, kw = app(device, ckv=(2, 0, 512), kpe=(2, 0, 64), lens=[17, 0])
    raises(APP, "cache_seqlens[0] = 17 plus 0 new tokens exceeds the cache capacity 16", *args, **kw)


def test_append_slot_mapping_dtype_shape(device):
    (c, ckv, kpe), kw = pag(device)
    s = kw["slot_mapping"]
    msg = "slot_mapping must be an int32 or int64 tensor of shape [5], got "
    raises(APP, msg + "float32 tensor of shape [5]", c, ckv, kpe, slot_mapping=s.float())
    raises(APP, msg + "int16 tensor of shape [5]", c, ckv, kpe, slot_mapping=s.short())
    raises(APP, msg + "int64 tensor of shape [4]", c, ckv, kpe, slot_mapping=s.long()[:4])
    raises(APP, msg + "int32 tensor of shape [5, 1]", c, ckv, kpe, slot_mapping=s.reshape(5, 1))


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64],
                         ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.host_value_check
def test_append_slot_out_of_range(slot_dtype, device):
    # tokens 0..2 are valid: a kernel that writes while checking would have written them
    raises(APP, "slot_mapping[3] = 96 is out of range: the cache has 96 slots (num_blocks 6 x "
                "block_size 16); -1 skips a token",
           *pag(device)[0], **pag(device, slots=[3, 17, -1, 96, 5], slot_dtype=slot_dtype)[1])
    raises(APP, "slot_mapping[4] = 1000 is out of range: the cache has 96 slots (num_blocks 6 x "
                "block_size 16); -1 skips a token",
           *pag(device)[0], **pag(device, slots=[3, 17, -1, 95, 1000], slot_dtype=slot_dtype)[1])
    raises(APP, "slot_mapping[2] = -2 is out of range: the cache has 96 slots (num_blocks 6 x "
                "block_size 16); -1 skips a token",
           *pag(device)[0], **pag(device, slots=[3, 17, -2, 95, 0], slot_dtype=slot_dtype)[1])
    # block size 1
    args, kw = pag(device, c=(6, 1, 576), slots=[6, 0, 1, 2, 3], slot_dtype=slot_dtype)
    raises(APP, "slot_mapping[0] = 6 is out of range: the cache has 6 slots (num_blocks 6 x "
                "block_size 1); -1 skips a token", *args, **kw)


@pytest.mark.host_value_check
def test_append_torch_ops_path_same_message(device):
    args, kw = app(device, lens=[2, 14])
    expect_error(APP, "cache_seqlens[1] = 14 plus 3 new tokens exceeds the cache capacity 16", *args,
                 call=torch.ops.attn_ops.mla_cache_append, written=args[:1], **kw)
    args, kw = pag(device, slots=[3, 17, -1, 96, 5])
    expect_error(APP, "slot_mapping[3] = 96 is out of range", *args,
                 call=torch.ops.attn_ops.mla_cache_append.default, written=args[:1], **kw)


def test_append_rejected_on_sliced_cache_view_writes_nothing(device):
    # the cache is a view of a wider buffer: the padding columns must stay untouched too
    buf = torch.randn(2, 16, 580, device=device)
    (_, ckv, kpe), kw = app(device, lens=[2, 14])
    raises(APP, "cache_seqlens[1] = 14", buf[..., :576], ckv, kpe, **kw)  # snapshots the whole buffer


# --------------------------------------------------------------------------------------------------
# mla_decode
# --------------------------------------------------------------------------------------------------
def test_decode_q_ranks(device):
    args, kw = dec(device, ql=(2, 16, 512))
    raises(DEC, "q_latent must be a 4-D tensor [batch, seqlen_q, heads, kv_lora_rank], got a 3-D "
                "tensor of shape [2, 16, 512]", *args, **kw)
    args, kw = dec(device, qr=(2, 16, 64))
    raises(DEC, "q_rope must be a 4-D tensor [batch, seqlen_q, heads, rope_dim], got a 3-D tensor "
                "of shape [2, 16, 64]", *args, **kw)


def test_decode_q_rope_shape(device):
    msg = "q_rope must have shape [2, 1, 16, *] (batch, seqlen_q, heads of q_latent), got "
    raises(DEC, msg + "[2, 1, 8, 64]", *dec(device, qr=(2, 1, 8, 64))[0], **dec(device)[1])
    raises(DEC, msg + "[2, 2, 16, 64]", *dec(device, qr=(2, 2, 16, 64))[0], **dec(device)[1])
    raises(DEC, msg + "[1, 1, 16, 64]", *dec(device, qr=(1, 1, 16, 64))[0], **dec(device)[1])


def test_decode_cache_rank(device):
    args, kw = dec(device, c=(2, 32, 1, 576))
    raises(DEC, "latent_cache must be a 3-D tensor [batch, capacity, kv_lora_rank + rope_dim], got "
                "a 4-D tensor of shape [2, 32, 1, 576]", *args, **kw)
    args, kw = pdec(device, c=(96, 576))
    raises(DEC, "latent_cache must be a 3-D tensor [num_blocks, block_size, kv_lora_rank + "
                "rope_dim] when block_table is given, got a 2-D tensor of shape [96, 576]",
           *args, **kw)


@pytest.mark.parametrize("bad", [torch.int32, torch.int64, torch.bool],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_decode_q_dtype(bad, device):
    name = str(bad).replace("torch.", "")
    args, kw = dec(device, dtype=bad)
    raises(DEC, f"q_latent must be float16, bfloat16, float32 or float64, got {name}", *args, **kw)


def test_decode_same_dtype(device):
    (ql, qr, c, sl), kw = dec(device)
    raises(DEC, "q_rope must have the same dtype as q_latent (float32), got bfloat16",
           ql, qr.bfloat16(), c, sl, **kw)
    raises(DEC, "latent_cache must have the same dtype as q_latent (float32), got float64",
           ql, qr, c.double(), sl, **kw)
    (ql, qr, c, sl), kw = pdec(device, dtype=torch.bfloat16)
    raises(DEC, "latent_cache must have the same dtype as q_latent (bfloat16), got float16",
           ql, qr, c.half(), sl, **kw)


def test_decode_device_meta():
    (ql, qr, c, sl), kw = pdec("cpu")
    raises(DEC, "q_rope must be on the same device as q_latent (cpu), got meta",
           ql, qr.to("meta"), c, sl, **kw)
    raises(DEC, "latent_cache must be on the same device as q_latent (cpu), got meta",
           ql, qr, c.to("meta"), sl, **kw)
    raises(DEC, "cache_seqlens must be on the same device as q_latent (cpu), got meta",
           ql, qr, c, sl.to("meta"), **kw)
    raises(DEC, "block_table must be on the same device as q_latent (cpu), got meta",
           ql, qr, c, sl, scale=SCALE, block_table=kw["block_table"].to("meta"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_decode_device_cuda():
    (ql, qr, c, sl), kw = dec("cpu")
    raises(DEC, "latent_cache must be on the same device as q_latent (cpu), got cuda",
           ql, qr, c.cuda(), sl, **kw)
    (ql, qr, c, sl), kw = pdec("cuda")
    raises(DEC, "cache_seqlens must be on the same device as q_latent (cuda",
           ql, qr, c, sl.cpu(), **kw)
    raises(DEC, "block_table must be on the same device as q_latent (cuda", ql, qr, c, sl,
           scale=SCALE, block_table=kw["block_table"].cpu())


def test_decode_last_dim_stride(device):
    (ql, qr, c, sl), kw = dec(device)
    raises(DEC, "q_latent must have stride 1 in its last dimension, got stride 2",
           strided(Q_L, device), qr, c, sl, **kw)
    raises(DEC, "q_rope must have stride 1 in its last dimension, got stride 2",
           ql, strided(Q_R, device), c, sl, **kw)
    raises(DEC, "latent_cache must have stride 1 in its last dimension, got stride 2",
           ql, qr, strided(D_C, device), sl, **kw)
    (ql, qr, c, sl), kw = pdec(device)
    raises(DEC, "latent_cache must have stride 1 in its last dimension, got stride 2",
           ql, qr, strided(D_PC, device), sl, **kw)


def test_decode_last_dim(device):
    msg = ("latent_cache must have last dim kv_lora_rank + rope_dim = 512 + 64 = 576 (from q_latent "
           "and q_rope), got ")
    raises(DEC, msg + "560", *dec(device, c=(2, 32, 560))[0], **dec(device)[1])
    raises(DEC, msg + "512", *pdec(device, c=(6, 16, 512))[0], **pdec(device)[1])
    args, kw = dec(device, ql=(2, 1, 16, 32), qr=(2, 1, 16, 16))
    raises(DEC, "latent_cache must have last dim kv_lora_rank + rope_dim = 32 + 16 = 48 (from "
                "q_latent and q_rope), got 576", *args, **kw)


def test_width_limit(device):
    """kv_lora_rank + rope_dim at most 1024 (the kernels' head-dim limit), in both ops."""
    msg = "kv_lora_rank + rope_dim must be at most 1024, got 1024 + 64 = 1088"
    raises(DEC, msg, *dec(device, ql=(2, 1, 2, 1024), qr=(2, 1, 2, 64), c=(2, 8, 1088))[0], **dec(device)[1])
    args, kw = app(device, c=(2, 16, 1088), ckv=(2, 3, 1024))
    raises(APP, msg, *args, **kw)


def test_append_zero_rank(device):
    args, kw = app(device, c=(2, 16, 64), ckv=(2, 3, 0))
    raises(APP, "kv_lora_rank (the last dim of c_kv) must be at least 1, got 0", *args, **kw)


def test_decode_batch_size(device):
    raises(DEC, "latent_cache must have batch size 2 (as q_latent), got 3",
           *dec(device, c=(3, 32, 576))[0], **dec(device)[1])


def test_decode_scale(device):
    args, _ = dec(device)
    raises(DEC, "scale must be finite with |scale| <= 3.40282e+38 "
           "(representable in float32, the accumulation type of this input dtype), got inf",
           *args, scale=float("inf"))
    raises(DEC, "scale must be finite with |scale| <= 3.40282e+38 "
           "(representable in float32, the accumulation type of this input dtype), got -inf",
           *args, scale=float("-inf"))
    raises_re(DEC, re.escape("scale must be finite with |scale| <= 3.40282e+38 "
                             "(representable in float32, the accumulation type of this input dtype), got ")
              + "(?i:-?nan)", *args, scale=float("nan"))


def test_decode_scale_is_required(device):
    args, _ = dec(device)
    with pytest.raises(TypeError):
        attn_ops.mla_decode(*args)
    with pytest.raises((TypeError, RuntimeError)):
        torch.ops.attn_ops.mla_decode(*args)


def test_decode_seqlens_dtype_shape(device):
    (ql, qr, c, sl), kw = dec(device)
    msg = "cache_seqlens must be an int32 tensor of shape [2], got "
    raises(DEC, msg + "int64 tensor of shape [2]", ql, qr, c, sl.long(), **kw)
    raises(DEC, msg + "float32 tensor of shape [2]", ql, qr, c, sl.float(), **kw)
    raises(DEC, msg + "int32 tensor of shape [3]", ql, qr, c, i32([5, 20, 1], device), **kw)
    (ql, qr, c, sl), kw = pdec(device)
    raises(DEC, msg + "int64 tensor of shape [2]", ql, qr, c, sl.long(), **kw)


def test_decode_block_table_dtype_shape(device):
    (ql, qr, c, sl), kw = pdec(device)
    bt = kw.pop("block_table")
    msg = "block_table must be an int32 tensor of shape [2, max_blocks_per_seq], got "
    raises(DEC, msg + "int64 tensor of shape [2, 4]", ql, qr, c, sl,
           block_table=i32([[3, 0, 1, 2], [5, 1, 4, 2]], device).long(), **kw)
    raises(DEC, msg + "int32 tensor of shape [3, 2]", ql, qr, c, sl,
           block_table=i32([[3, 0], [5, 1], [2, 4]], device), **kw)
    raises(DEC, msg + "int32 tensor of shape [4]", ql, qr, c, sl, block_table=bt.reshape(4), **kw)


@pytest.mark.host_value_check
def test_decode_seqlens_negative(device):
    raises(DEC, "cache_seqlens[1] = -1 must be >= 0", *dec(device, lens=[5, -1])[0],
           **dec(device)[1])
    args, kw = pdec(device, lens=[-3, 5])
    raises(DEC, "cache_seqlens[0] = -3 must be >= 0", *args, **kw)


@pytest.mark.host_value_check
def test_decode_seqlens_exceed_capacity(device):
    raises(DEC, "cache_seqlens[1] = 40 exceeds the cache capacity 32",
           *dec(device, lens=[5, 40])[0], **dec(device)[1])
    raises(DEC, "cache_seqlens[0] = 33 exceeds the cache capacity 32",
           *dec(device, lens=[33, 0])[0], **dec(device)[1])
    args, kw = pdec(device, lens=[5, 40])
    raises(DEC, "cache_seqlens[1] = 40 exceeds the cache capacity 32 (max_blocks_per_seq 2 x "
                "block_size 16)", *args, **kw)


@pytest.mark.host_value_check
def test_decode_block_table_out_of_range(device):
    # row 1 (length 20) uses both of its entries
    args, kw = pdec(device, bt=[[3, 0], [7, 1]])
    raises(DEC, "block_table[1, 0] = 7 is out of range [0, 6)", *args, **kw)
    args, kw = pdec(device, bt=[[3, 0], [5, -1]])
    raises(DEC, "block_table[1, 1] = -1 is out of range [0, 6)", *args, **kw)
    args, kw = pdec(device, bt=[[6, 0], [5, 1]])
    raises(DEC, "block_table[0, 0] = 6 is out of range [0, 6)", *args, **kw)


@pytest.mark.host_value_check
def test_decode_torch_ops_path_same_message(device):
    args, kw = pdec(device, bt=[[3, 0], [7, 1]])
    expect_error(DEC, "block_table[1, 0] = 7 is out of range [0, 6)", *args, call=torch.ops.attn_ops.mla_decode,
                 **kw)


# --------------------------------------------------------------------------------------------------
# Overflow-prone values: a clean error, never a crash (first run in a child process)
# --------------------------------------------------------------------------------------------------
I32_MAX, I32_MIN = 2 ** 31 - 1, -2 ** 31
OOR = " is out of range: the cache has 96 slots (num_blocks 6 x block_size 16); -1 skips a token"


def _slot(value, dtype, idx=3):
    slots = list(P_SLOTS)
    slots[idx] = value
    args, kw = pag(slots=slots, slot_dtype=dtype)
    raises(APP, f"slot_mapping[{idx}] = {value}{OOR}", *args, **kw)


def _app_lens(msg, lens):
    args, kw = app(lens=lens)
    raises(APP, msg, *args, **kw)


def _dec(msg, paged=False, **kw_inputs):
    args, kw = (pdec if paged else dec)(**kw_inputs)
    raises(DEC, msg, *args, **kw)


NASTY = {
    "append_seqlens_int32_max": lambda: _app_lens(
        f"cache_seqlens[1] = {I32_MAX} plus 3 new tokens exceeds the cache capacity 16",
        [2, I32_MAX]),
    "append_seqlens_int32_max_minus_1": lambda: _app_lens(
        f"cache_seqlens[1] = {I32_MAX - 1} plus 3 new tokens exceeds the cache capacity 16",
        [2, I32_MAX - 1]),
    "append_seqlens_int32_min": lambda: _app_lens(
        f"cache_seqlens[1] = {I32_MIN} must be >= 0", [2, I32_MIN]),
    "slot_minus_2_int64": lambda: _slot(-2, torch.int64),
    "slot_int32_max": lambda: _slot(I32_MAX, torch.int32),
    "slot_int32_min": lambda: _slot(I32_MIN, torch.int32),
    "slot_2p40_int64": lambda: _slot(2 ** 40, torch.int64),
    "slot_minus_2p40_int64": lambda: _slot(-2 ** 40, torch.int64),
    "slot_int64_max": lambda: _slot(2 ** 63 - 1, torch.int64, idx=0),
    "decode_seqlens_int32_max_contig": lambda: _dec(
        f"cache_seqlens[1] = {I32_MAX} exceeds the cache capacity 32", lens=[5, I32_MAX]),
    "decode_seqlens_int32_max_paged": lambda: _dec(
        f"cache_seqlens[1] = {I32_MAX} exceeds the cache capacity 32 (max_blocks_per_seq 2 x "
        "block_size 16)", paged=True, lens=[5, I32_MAX]),
    "decode_seqlens_int32_min": lambda: _dec(
        f"cache_seqlens[0] = {I32_MIN} must be >= 0", paged=True, lens=[I32_MIN, 5]),
    "decode_block_table_int32_max": lambda: _dec(
        f"block_table[1, 1] = {I32_MAX} is out of range [0, 6)", paged=True,
        bt=[[3, 0], [5, I32_MAX]]),
    "decode_block_table_int32_min": lambda: _dec(
        f"block_table[0, 0] = {I32_MIN} is out of range [0, 6)", paged=True,
        bt=[[I32_MIN, 0], [5, 1]]),
}


@pytest.fixture(scope="module")
def crash_report():
    """Every case of NASTY run in child processes first: name -> None, or how the process died."""
    return crash_isolation.crash_report("test_mla_errors", "NASTY", NASTY, timeout=120)


@pytest.mark.parametrize("name", list(NASTY))
def test_overflow_inputs(name, crash_report):
    crash = crash_report.get(name)
    if crash is not None:
        pytest.fail(f"input {name!r} crashed the process: {crash}")
    NASTY[name]()
