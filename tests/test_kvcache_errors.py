"""Bad-input tests for the KV-cache ops: every error message of docs/kvcache_api.md, and for every
rejected append a check that the caches (the whole buffers they live in) are bit-identical to
before: a rejected call writes nothing, even when only the last row / token is bad.

Inputs that could make a careless kernel write or read out of bounds (int32 overflow of lengths,
huge slots / block indices) are first run in a child process, so a crash fails only its own case.
"""

import re

import pytest
import torch

import attn_ops
import crash_isolation
from error_helpers import expect_error, i32, rand, strided

APP, PAG, ATT = "kv_cache_append", "paged_kv_cache_append", "attention_with_kvcache"

# kv_cache_append: caches [B=2, capacity=16, Hkv=4, 64], 3 new tokens, lengths [2, 5]
A_KC, A_VC, A_K, A_V, A_LENS = (2, 16, 4, 64), (2, 16, 4, 64), (2, 3, 4, 64), (2, 3, 4, 64), [2, 5]
# paged_kv_cache_append: 6 blocks of 16 slots, 5 tokens
P_KC, P_VC, P_K, P_V, P_SLOTS = (6, 16, 4, 64), (6, 16, 4, 64), (5, 4, 64), (5, 4, 64), \
    [3, 17, -1, 40, 95]
# attention_with_kvcache: q [2, 1, 8, 64]; contiguous caches capacity 32; paged 6 blocks of 16,
# block_table [2, 2]
Q, C_KC, C_VC, PG_KC, PG_VC = (2, 1, 8, 64), (2, 32, 4, 64), (2, 32, 4, 64), (6, 16, 4, 64), \
    (6, 16, 4, 64)
Q_LENS, BT = [5, 20], [[3, 0], [5, 1]]


def raises(op, msg, *args, **kw):
    """The op raises RuntimeError with "attn_ops.<op>: " + msg and (appends) leaves the caches untouched."""
    expect_error(op, msg, *args, written=args[:2] if op in (APP, PAG) else (), **kw)


def raises_re(op, pattern, *args, **kw):
    expect_error(op, pattern, *args, written=args[:2] if op in (APP, PAG) else (), regex=True, **kw)


def app_args(device="cpu", kc=A_KC, vc=A_VC, k=A_K, v=A_V, lens=A_LENS, dtype=torch.float32):
    return (rand(kc, dtype, device), rand(vc, dtype, device), rand(k, dtype, device),
            rand(v, dtype, device), i32(lens, device))


def pag_args(device="cpu", kc=P_KC, vc=P_VC, k=P_K, v=P_V, slots=P_SLOTS, dtype=torch.float32,
             slot_dtype=torch.int32):
    return (rand(kc, dtype, device), rand(vc, dtype, device), rand(k, dtype, device),
            rand(v, dtype, device), torch.tensor(slots, dtype=slot_dtype, device=device))


def att_args(device="cpu", q=Q, kc=C_KC, vc=C_VC, lens=Q_LENS, dtype=torch.float32):
    return (rand(q, dtype, device), rand(kc, dtype, device), rand(vc, dtype, device),
            i32(lens, device))


def paged_att(device="cpu", q=Q, kc=PG_KC, vc=PG_VC, lens=Q_LENS, bt=BT, dtype=torch.float32):
    args = att_args(device, q, kc, vc, lens, dtype)
    return args, dict(block_table=i32(bt, device) if isinstance(bt, list) else bt)


def with_(args, i, value):
    args = list(args)
    args[i] = value
    return tuple(args)


# --------------------------------------------------------------------------------------------------
# kv_cache_append
# --------------------------------------------------------------------------------------------------
def test_append_ranks(device):
    raises(APP, "k_cache must be a 4-D tensor [batch, capacity, heads_kv, head_dim], got a 3-D "
                "tensor of shape [2, 16, 64]", *app_args(device, kc=(2, 16, 64)))
    raises(APP, "v_cache must be a 4-D tensor [batch, capacity, heads_kv, head_dim_v], got a 5-D "
                "tensor of shape [2, 16, 4, 64, 1]", *app_args(device, vc=(2, 16, 4, 64, 1)))
    raises(APP, "k must be a 4-D tensor [batch, seqlen_new, heads_kv, head_dim], got a 3-D "
                "tensor of shape [2, 3, 64]", *app_args(device, k=(2, 3, 64)))
    raises(APP, "v must be a 4-D tensor [batch, seqlen_new, heads_kv, head_dim_v], got a 3-D "
                "tensor of shape [6, 4, 64]", *app_args(device, v=(6, 4, 64)))


@pytest.mark.parametrize("bad", [torch.int32, torch.int64, torch.bool],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_append_cache_dtype(bad, device):
    name = str(bad).replace("torch.", "")
    raises(APP, f"k_cache must be float16, bfloat16, float32, float64, float8_e4m3fn or float8_e5m2, got {name}",
           *app_args(device, dtype=bad))


def test_append_same_dtype(device):
    kc, vc, k, v, sl = app_args(device)
    raises(APP, "v_cache must have the same dtype as k_cache (float32), got bfloat16",
           kc, vc.bfloat16(), k, v, sl)
    raises(APP, "k must have the same dtype as k_cache (float32), got bfloat16",
           kc, vc, k.bfloat16(), v, sl)
    raises(APP, "v must have the same dtype as k_cache (float32), got float64",
           kc, vc, k, v.double(), sl)
    kc, vc, k, v, sl = app_args(device, dtype=torch.float16)
    raises(APP, "k must have the same dtype as k_cache (float16), got float32",
           kc, vc, k.float(), v, sl)


def test_append_device_meta():
    kc, vc, k, v, sl = app_args("cpu")
    raises(APP, "k_cache, v_cache, k and v must be on the same device, "
                "got k_cache on cpu, v_cache on meta, k on cpu, v on cpu",
           kc, vc.to("meta"), k, v, sl)
    raises(APP, "k_cache, v_cache, k and v must be on the same device, "
                "got k_cache on cpu, v_cache on cpu, k on meta, v on cpu",
           kc, vc, k.to("meta"), v, sl)
    raises(APP, "k_cache, v_cache, k and v must be on the same device, "
                "got k_cache on cpu, v_cache on cpu, k on cpu, v on meta",
           kc, vc, k, v.to("meta"), sl)
    raises(APP, "cache_seqlens must be on the same device as k_cache (cpu), got meta",
           kc, vc, k, v, sl.to("meta"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_append_device_cuda():
    kc, vc, k, v, sl = app_args("cpu")
    raises(APP, "k must be on the same device as k_cache (cpu), got cuda", kc, vc, k.cuda(), v, sl)
    raises(APP, "cache_seqlens must be on the same device as k_cache (cpu), got cuda",
           kc, vc, k, v, sl.cuda())
    kc, vc, k, v, sl = app_args("cuda")
    raises(APP, "cache_seqlens must be on the same device as k_cache (cuda", kc, vc, k, v, sl.cpu())
    raises(APP, "v_cache must be on the same device as k_cache (cuda", kc, vc.cpu(), k, v, sl)


def test_append_last_dim_stride(device):
    kc, vc, k, v, sl = app_args(device)
    raises(APP, "k_cache must have stride 1 in its last dimension, got stride 2",
           strided(A_KC, device), vc, k, v, sl)
    raises(APP, "v_cache must have stride 1 in its last dimension, got stride 2",
           kc, strided(A_VC, device), k, v, sl)
    raises(APP, "k must have stride 1 in its last dimension, got stride 2",
           kc, vc, strided(A_K, device), v, sl)
    raises(APP, "v must have stride 1 in its last dimension, got stride 2",
           kc, vc, k, strided(A_V, device), sl)


def test_append_v_cache_shape(device):
    msg = "v_cache must have shape [2, 16, 4, *] (batch, capacity, heads_kv of k_cache), got "
    raises(APP, msg + "[2, 8, 4, 64]", *app_args(device, vc=(2, 8, 4, 64)))
    raises(APP, msg + "[3, 16, 4, 64]", *app_args(device, vc=(3, 16, 4, 64)))
    raises(APP, msg + "[2, 16, 2, 64]", *app_args(device, vc=(2, 16, 2, 64)))


def test_append_k_shape(device):
    msg = "k must have shape [2, *, 4, 64] (batch, heads_kv, head_dim of k_cache), got "
    raises(APP, msg + "[2, 3, 4, 32]", *app_args(device, k=(2, 3, 4, 32)))
    raises(APP, msg + "[3, 3, 4, 64]", *app_args(device, k=(3, 3, 4, 64)))
    raises(APP, msg + "[2, 3, 2, 64]", *app_args(device, k=(2, 3, 2, 64)))


def test_append_v_shape(device):
    msg = ("v must have shape [2, 3, 4, 64] (batch, seqlen_new, heads_kv of k and head_dim_v of "
           "v_cache), got ")
    raises(APP, msg + "[2, 2, 4, 64]", *app_args(device, v=(2, 2, 4, 64)))
    raises(APP, msg + "[2, 3, 4, 32]", *app_args(device, v=(2, 3, 4, 32)))
    raises(APP, msg + "[2, 3, 1, 64]", *app_args(device, v=(2, 3, 1, 64)))
    # head_dim_v comes from v_cache (Dk != Dv allowed)
    raises(APP, msg.replace("[2, 3, 4, 64]", "[2, 3, 4, 32]") + "[2, 3, 4, 64]",
           *app_args(device, vc=(2, 16, 4, 32)))


def test_append_seqlens_dtype_shape(device):
    kc, vc, k, v, sl = app_args(device)
    msg = "cache_seqlens must be an int32 tensor of shape [2], got "
    raises(APP, msg + "int64 tensor of shape [2]", kc, vc, k, v, sl.long())
    raises(APP, msg + "float32 tensor of shape [2]", kc, vc, k, v, sl.float())
    raises(APP, msg + "int32 tensor of shape [3]", kc, vc, k, v, i32([2, 5, 1], device))
    raises(APP, msg + "int32 tensor of shape [2, 1]", kc, vc, k, v, sl.reshape(2, 1))


@pytest.mark.host_value_check
def test_append_seqlens_negative(device):
    raises(APP, "cache_seqlens[1] = -1 must be >= 0", *app_args(device, lens=[2, -1]))
    raises(APP, "cache_seqlens[0] = -5 must be >= 0", *app_args(device, lens=[-5, 2]))


@pytest.mark.host_value_check
def test_append_exceeds_capacity(device):
    # row 0 is valid: a kernel that writes row by row while checking would have written it
    raises(APP, "cache_seqlens[1] = 14 plus 3 new tokens exceeds the cache capacity 16",
           *app_args(device, lens=[2, 14]))
    raises(APP, "cache_seqlens[1] = 16 plus 3 new tokens exceeds the cache capacity 16",
           *app_args(device, lens=[13, 16]))
    raises(APP, "cache_seqlens[0] = 17 plus 0 new tokens exceeds the cache capacity 16",
           *app_args(device, k=(2, 0, 4, 64), v=(2, 0, 4, 64), lens=[17, 0]))


@pytest.mark.host_value_check
def test_append_torch_ops_path_same_message(device):
    args = app_args(device, lens=[2, 14])
    expect_error(APP, "cache_seqlens[1] = 14 plus 3 new tokens exceeds the cache capacity 16", *args,
                 call=torch.ops.attn_ops.kv_cache_append, written=args[:2])


# --------------------------------------------------------------------------------------------------
# paged_kv_cache_append
# --------------------------------------------------------------------------------------------------
def test_paged_ranks(device):
    raises(PAG, "k_cache must be a 4-D tensor [num_blocks, block_size, heads_kv, head_dim], got "
                "a 3-D tensor of shape [6, 16, 64]", *pag_args(device, kc=(6, 16, 64)))
    raises(PAG, "v_cache must be a 4-D tensor [num_blocks, block_size, heads_kv, head_dim_v], "
                "got a 5-D tensor of shape [6, 16, 4, 64, 1]",
           *pag_args(device, vc=(6, 16, 4, 64, 1)))
    raises(PAG, "k must be a 3-D tensor [num_tokens, heads_kv, head_dim], got a 4-D tensor of "
                "shape [5, 1, 4, 64]", *pag_args(device, k=(5, 1, 4, 64)))
    raises(PAG, "v must be a 3-D tensor [num_tokens, heads_kv, head_dim_v], got a 2-D tensor of "
                "shape [5, 256]", *pag_args(device, v=(5, 256)))


@pytest.mark.parametrize("bad", [torch.int32, torch.int64, torch.bool],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_paged_cache_dtype(bad, device):
    name = str(bad).replace("torch.", "")
    raises(PAG, f"k_cache must be float16, bfloat16, float32, float64, float8_e4m3fn or float8_e5m2, got {name}",
           *pag_args(device, dtype=bad))


def test_paged_same_dtype(device):
    kc, vc, k, v, s = pag_args(device)
    raises(PAG, "v_cache must have the same dtype as k_cache (float32), got bfloat16",
           kc, vc.bfloat16(), k, v, s)
    raises(PAG, "k must have the same dtype as k_cache (float32), got float16",
           kc, vc, k.half(), v, s)
    raises(PAG, "v must have the same dtype as k_cache (float32), got float64",
           kc, vc, k, v.double(), s)


def test_paged_device_meta():
    kc, vc, k, v, s = pag_args("cpu")
    raises(PAG, "k_cache, v_cache, k and v must be on the same device, "
                "got k_cache on cpu, v_cache on meta, k on cpu, v on cpu",
           kc, vc.to("meta"), k, v, s)
    raises(PAG, "k_cache, v_cache, k and v must be on the same device, "
                "got k_cache on cpu, v_cache on cpu, k on meta, v on cpu",
           kc, vc, k.to("meta"), v, s)
    raises(PAG, "k_cache, v_cache, k and v must be on the same device, "
                "got k_cache on cpu, v_cache on cpu, k on cpu, v on meta",
           kc, vc, k, v.to("meta"), s)
    raises(PAG, "slot_mapping must be on the same device as k_cache (cpu), got meta",
           kc, vc, k, v, s.to("meta"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_paged_device_cuda():
    kc, vc, k, v, s = pag_args("cpu")
    raises(PAG, "slot_mapping must be on the same device as k_cache (cpu), got cuda",
           kc, vc, k, v, s.cuda())
    kc, vc, k, v, s = pag_args("cuda")
    raises(PAG, "slot_mapping must be on the same device as k_cache (cuda", kc, vc, k, v, s.cpu())
    raises(PAG, "v must be on the same device as k_cache (cuda", kc, vc, k, v.cpu(), s)


def test_paged_last_dim_stride(device):
    kc, vc, k, v, s = pag_args(device)
    raises(PAG, "k_cache must have stride 1 in its last dimension, got stride 2",
           strided(P_KC, device), vc, k, v, s)
    raises(PAG, "v_cache must have stride 1 in its last dimension, got stride 2",
           kc, strided(P_VC, device), k, v, s)
    raises(PAG, "k must have stride 1 in its last dimension, got stride 2",
           kc, vc, strided(P_K, device), v, s)
    raises(PAG, "v must have stride 1 in its last dimension, got stride 2",
           kc, vc, k, strided(P_V, device), s)


def test_paged_v_cache_shape(device):
    msg = "v_cache must have shape [6, 16, 4, *] (num_blocks, block_size, heads_kv of k_cache), got "
    raises(PAG, msg + "[6, 8, 4, 64]", *pag_args(device, vc=(6, 8, 4, 64)))
    raises(PAG, msg + "[5, 16, 4, 64]", *pag_args(device, vc=(5, 16, 4, 64)))
    raises(PAG, msg + "[6, 16, 2, 64]", *pag_args(device, vc=(6, 16, 2, 64)))


def test_paged_k_shape(device):
    msg = "k must have shape [*, 4, 64] (heads_kv, head_dim of k_cache), got "
    raises(PAG, msg + "[5, 4, 32]", *pag_args(device, k=(5, 4, 32)))
    raises(PAG, msg + "[5, 2, 64]", *pag_args(device, k=(5, 2, 64)))


def test_paged_v_shape(device):
    msg = ("v must have shape [5, 4, 64] (num_tokens, heads_kv of k and head_dim_v of v_cache), "
           "got ")
    raises(PAG, msg + "[4, 4, 64]", *pag_args(device, v=(4, 4, 64)))
    raises(PAG, msg + "[5, 4, 32]", *pag_args(device, v=(5, 4, 32)))
    raises(PAG, msg + "[5, 1, 64]", *pag_args(device, v=(5, 1, 64)))


def test_paged_slot_mapping_dtype_shape(device):
    kc, vc, k, v, s = pag_args(device)
    msg = "slot_mapping must be an int32 or int64 tensor of shape [5], got "
    raises(PAG, msg + "float32 tensor of shape [5]", kc, vc, k, v, s.float())
    raises(PAG, msg + "int16 tensor of shape [5]", kc, vc, k, v, s.short())
    raises(PAG, msg + "int64 tensor of shape [4]", kc, vc, k, v, s.long()[:4])
    raises(PAG, msg + "int32 tensor of shape [5, 1]", kc, vc, k, v, s.reshape(5, 1))


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64],
                         ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.host_value_check
def test_paged_slot_out_of_range(slot_dtype, device):
    # tokens 0..2 are valid: a kernel that writes while checking would have written them
    raises(PAG, "slot_mapping[3] = 96 is out of range: the cache has 96 slots (num_blocks 6 x "
                "block_size 16); -1 skips a token",
           *pag_args(device, slots=[3, 17, -1, 96, 5], slot_dtype=slot_dtype))
    raises(PAG, "slot_mapping[4] = 1000 is out of range: the cache has 96 slots (num_blocks 6 x "
                "block_size 16); -1 skips a token",
           *pag_args(device, slots=[3, 17, -1, 95, 1000], slot_dtype=slot_dtype))
    # block size 1
    raises(PAG, "slot_mapping[0] = 6 is out of range: the cache has 6 slots (num_blocks 6 x "
                "block_size 1); -1 skips a token",
           *pag_args(device, kc=(6, 1, 4, 64), vc=(6, 1, 4, 64), slots=[6, 0, 1, 2, 3],
                     slot_dtype=slot_dtype))


@pytest.mark.host_value_check
def test_paged_torch_ops_path_same_message(device):
    args = pag_args(device, slots=[3, 17, -1, 96, 5])
    expect_error(PAG, "slot_mapping[3] = 96 is out of range", *args,
                 call=torch.ops.attn_ops.paged_kv_cache_append, written=args[:2])


# --------------------------------------------------------------------------------------------------
# attention_with_kvcache
# --------------------------------------------------------------------------------------------------
def test_attn_q_rank(device):
    raises(ATT, "q must be a 4-D tensor [batch, seqlen_q, heads_q, head_dim], got a 3-D tensor of "
                "shape [2, 8, 64]", *att_args(device, q=(2, 8, 64)))


def test_attn_cache_ranks_contiguous(device):
    raises(ATT, "k_cache must be a 4-D tensor [batch, capacity, heads_kv, head_dim], got a 3-D "
                "tensor of shape [2, 32, 64]", *att_args(device, kc=(2, 32, 64)))
    raises(ATT, "v_cache must be a 4-D tensor [batch, capacity, heads_kv, head_dim_v], got a 5-D "
                "tensor of shape [2, 32, 4, 64, 1]", *att_args(device, vc=(2, 32, 4, 64, 1)))


def test_attn_cache_ranks_paged(device):
    args, kw = paged_att(device, kc=(6, 16, 64))
    raises(ATT, "k_cache must be a 4-D tensor [num_blocks, block_size, heads_kv, head_dim] when "
                "block_table is given, got a 3-D tensor of shape [6, 16, 64]", *args, **kw)
    args, kw = paged_att(device, vc=(6, 16, 256))
    raises(ATT, "v_cache must be a 4-D tensor [num_blocks, block_size, heads_kv, head_dim_v] when "
                "block_table is given, got a 3-D tensor of shape [6, 16, 256]", *args, **kw)


@pytest.mark.parametrize("bad", [torch.int32, torch.int64, torch.bool],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_attn_q_dtype(bad, device):
    name = str(bad).replace("torch.", "")
    raises(ATT, f"q must be float16, bfloat16, float32 or float64, got {name}",
           *att_args(device, dtype=bad))


def test_attn_cache_dtype(device):
    q, kc, vc, sl = att_args(device)
    raises(ATT, "k_cache must have the same dtype as q (float32), got bfloat16",
           q, kc.bfloat16(), vc, sl)
    raises(ATT, "v_cache must have the same dtype as q (float32), got float64",
           q, kc, vc.double(), sl)
    (q, kc, vc, sl), kw = paged_att(device, dtype=torch.bfloat16)
    raises(ATT, "k_cache must have the same dtype as q (bfloat16), got float32",
           q, kc.float(), vc, sl, **kw)


def test_attn_device_meta():
    q, kc, vc, sl = att_args("cpu")
    raises(ATT, "k_cache must be on the same device as q (cpu), got meta", q, kc.to("meta"), vc, sl)
    raises(ATT, "v_cache must be on the same device as q (cpu), got meta", q, kc, vc.to("meta"), sl)
    raises(ATT, "cache_seqlens must be on the same device as q (cpu), got meta",
           q, kc, vc, sl.to("meta"))
    (q, kc, vc, sl), kw = paged_att("cpu")
    raises(ATT, "block_table must be on the same device as q (cpu), got meta",
           q, kc, vc, sl, block_table=kw["block_table"].to("meta"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_attn_device_cuda():
    q, kc, vc, sl = att_args("cpu")
    raises(ATT, "k_cache must be on the same device as q (cpu), got cuda", q, kc.cuda(), vc, sl)
    (q, kc, vc, sl), kw = paged_att("cuda")
    raises(ATT, "cache_seqlens must be on the same device as q (cuda", q, kc, vc, sl.cpu(), **kw)
    raises(ATT, "block_table must be on the same device as q (cuda", q, kc, vc, sl,
           block_table=kw["block_table"].cpu())


def test_attn_last_dim_stride(device):
    q, kc, vc, sl = att_args(device)
    raises(ATT, "q must have stride 1 in its last dimension, got stride 2",
           strided(Q, device), kc, vc, sl)
    raises(ATT, "k_cache must have stride 1 in its last dimension, got stride 2",
           q, strided(C_KC, device), vc, sl)
    raises(ATT, "v_cache must have stride 1 in its last dimension, got stride 2",
           q, kc, strided(C_VC, device), sl)
    (q, kc, vc, sl), kw = paged_att(device)
    raises(ATT, "k_cache must have stride 1 in its last dimension, got stride 2",
           q, strided(PG_KC, device), vc, sl, **kw)


def test_attn_batch_size(device):
    raises(ATT, "k_cache must have batch size 2 (as q), got 3",
           *att_args(device, kc=(3, 32, 4, 64), vc=(3, 32, 4, 64)))


def test_attn_v_cache_shape(device):
    raises(ATT, "v_cache must have shape [2, 32, 4, *] (as k_cache), got [2, 16, 4, 64]",
           *att_args(device, vc=(2, 16, 4, 64)))
    raises(ATT, "v_cache must have shape [2, 32, 4, *] (as k_cache), got [3, 32, 4, 64]",
           *att_args(device, vc=(3, 32, 4, 64)))
    args, kw = paged_att(device, vc=(6, 16, 2, 64))
    raises(ATT, "v_cache must have shape [6, 16, 4, *] (as k_cache), got [6, 16, 2, 64]",
           *args, **kw)
    args, kw = paged_att(device, vc=(7, 16, 4, 64))
    raises(ATT, "v_cache must have shape [6, 16, 4, *] (as k_cache), got [7, 16, 4, 64]",
           *args, **kw)


def test_attn_heads_at_least_one(device):
    raises(ATT, "heads_q and heads_kv must be at least 1, got heads_q 0, heads_kv 4",
           *att_args(device, q=(2, 1, 0, 64)))
    raises(ATT, "heads_q and heads_kv must be at least 1, got heads_q 8, heads_kv 0",
           *att_args(device, kc=(2, 32, 0, 64), vc=(2, 32, 0, 64)))


def test_attn_heads_multiple(device):
    raises(ATT, "heads_q (6) must be a multiple of heads_kv (4)", *att_args(device, q=(2, 1, 6, 64)))
    args, kw = paged_att(device, q=(2, 1, 6, 64))
    raises(ATT, "heads_q (6) must be a multiple of heads_kv (4)", *args, **kw)


def test_attn_head_dim(device):
    raises(ATT, "k_cache must have head_dim 64 (as q), got 32", *att_args(device, kc=(2, 32, 4, 32)))
    args, kw = paged_att(device, kc=(6, 16, 4, 32))
    raises(ATT, "k_cache must have head_dim 64 (as q), got 32", *args, **kw)


def test_attn_head_dims_at_most_1024(device):
    raises(ATT, "head_dim_qk and head_dim_v must be at most 1024, got 1025 and 64",
           *att_args(device, q=(2, 1, 8, 1025), kc=(2, 32, 4, 1025)))
    args, kw = paged_att(device, vc=(6, 16, 4, 1025))
    raises(ATT, "head_dim_qk and head_dim_v must be at most 1024, got 64 and 1025", *args, **kw)


def test_attn_scalars(device):
    raises(ATT, "window_left must be >= -1 (-1 means unbounded), got -3", *att_args(device),
           window_left=-3)
    raises(ATT, "window_right must be >= -1 (-1 means unbounded), got -2", *att_args(device),
           causal=False, window_right=-2)
    raises(ATT, "softcap must be 0 (disabled) or in [1.17549e-38, 3.40282e+38] "
           "(representable in float32, the accumulation type of this input dtype), got -1",
           *att_args(device), softcap=-1.0)
    raises(ATT, "scale must be finite with |scale| <= 3.40282e+38 "
           "(representable in float32, the accumulation type of this input dtype), got inf",
           *att_args(device), scale=float("inf"))
    raises(ATT, "scale must be finite with |scale| <= 3.40282e+38 "
           "(representable in float32, the accumulation type of this input dtype), got -inf",
           *att_args(device), scale=float("-inf"))
    raises_re(ATT, re.escape("scale must be finite with |scale| <= 3.40282e+38 "
                             "(representable in float32, the accumulation type of this input dtype), got ")
              + "(?i:-?nan)", *att_args(device), scale=float("nan"))


def test_attn_seqlens_dtype_shape(device):
    q, kc, vc, sl = att_args(device)
    msg = "cache_seqlens must be an int32 tensor of shape [2], got "
    raises(ATT, msg + "int64 tensor of shape [2]", q, kc, vc, sl.long())
    raises(ATT, msg + "float32 tensor of shape [2]", q, kc, vc, sl.float())
    raises(ATT, msg + "int32 tensor of shape [3]", q, kc, vc, i32([5, 20, 1], device))
    (q, kc, vc, sl), kw = paged_att(device)
    raises(ATT, msg + "int64 tensor of shape [2]", q, kc, vc, sl.long(), **kw)


def test_attn_block_table_dtype_shape(device):
    (q, kc, vc, sl), kw = paged_att(device)
    bt = kw["block_table"]
    msg = "block_table must be an int32 tensor of shape [2, max_blocks_per_seq], got "
    raises(ATT, msg + "int64 tensor of shape [2, 4]", q, kc, vc, sl,
           block_table=i32([[3, 0, 1, 2], [5, 1, 4, 2]], device).long())
    raises(ATT, msg + "int32 tensor of shape [3, 2]", q, kc, vc, sl,
           block_table=i32([[3, 0], [5, 1], [2, 4]], device))
    raises(ATT, msg + "int32 tensor of shape [4]", q, kc, vc, sl, block_table=bt.reshape(4))


@pytest.mark.host_value_check
def test_attn_seqlens_negative(device):
    raises(ATT, "cache_seqlens[1] = -1 must be >= 0", *att_args(device, lens=[5, -1]))
    args, kw = paged_att(device, lens=[5, -1])
    raises(ATT, "cache_seqlens[1] = -1 must be >= 0", *args, **kw)


@pytest.mark.host_value_check
def test_attn_seqlens_exceed_capacity(device):
    raises(ATT, "cache_seqlens[1] = 40 exceeds the cache capacity 32",
           *att_args(device, lens=[5, 40]))
    raises(ATT, "cache_seqlens[0] = 33 exceeds the cache capacity 32",
           *att_args(device, lens=[33, 0]))
    args, kw = paged_att(device, lens=[5, 40])
    raises(ATT, "cache_seqlens[1] = 40 exceeds the cache capacity 32 (max_blocks_per_seq 2 x "
                "block_size 16)", *args, **kw)


@pytest.mark.host_value_check
def test_attn_block_table_out_of_range(device):
    args, kw = paged_att(device, bt=[[3, 0], [7, 1]])
    raises(ATT, "block_table[1, 0] = 7 is out of range [0, 6)", *args, **kw)
    args, kw = paged_att(device, bt=[[3, 0], [5, -1]])
    raises(ATT, "block_table[1, 1] = -1 is out of range [0, 6)", *args, **kw)
    args, kw = paged_att(device, bt=[[6, 0], [5, 1]])
    raises(ATT, "block_table[0, 0] = 6 is out of range [0, 6)", *args, **kw)


def test_attn_unused_block_table_entries_not_checked(device):
    # row 0 (length 5) uses only block_table[0, 0]; row 1 (length 16) only block_table[1, 0]
    args, kw = paged_att(device, lens=[5, 16], bt=[[3, 99], [5, -7]])
    out, lse = attn_ops.attention_with_kvcache(*args, **kw)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    args, kw = paged_att(device, lens=[0, 16], bt=[[-1, -1], [5, 6]])
    out, lse = attn_ops.attention_with_kvcache(*args, **kw)
    assert torch.isneginf(lse[0]).all() and (out[0] == 0).all()


# --------------------------------------------------------------------------------------------------
# Overflow-prone values: a clean error, never a crash (first run in a child process)
# --------------------------------------------------------------------------------------------------
I32_MAX, I32_MIN = 2 ** 31 - 1, -2 ** 31
OOR = " is out of range: the cache has 96 slots (num_blocks 6 x block_size 16); -1 skips a token"


def _paged_slot(value, dtype, idx=3):
    slots = [3, 17, -1, 40, 95]
    slots[idx] = value
    raises(PAG, f"slot_mapping[{idx}] = {value}{OOR}", *pag_args(slots=slots, slot_dtype=dtype))


NASTY = {
    "append_seqlens_int32_max": lambda: raises(
        APP, f"cache_seqlens[1] = {I32_MAX} plus 3 new tokens exceeds the cache capacity 16",
        *app_args(lens=[2, I32_MAX])),
    "append_seqlens_int32_max_minus_1": lambda: raises(
        APP, f"cache_seqlens[1] = {I32_MAX - 1} plus 3 new tokens exceeds the cache capacity 16",
        *app_args(lens=[2, I32_MAX - 1])),
    "append_seqlens_int32_min": lambda: raises(
        APP, f"cache_seqlens[1] = {I32_MIN} must be >= 0", *app_args(lens=[2, I32_MIN])),
    "paged_slot_minus_2_int32": lambda: _paged_slot(-2, torch.int32),
    "paged_slot_minus_2_int64": lambda: _paged_slot(-2, torch.int64),
    "paged_slot_int32_max": lambda: _paged_slot(I32_MAX, torch.int32),
    "paged_slot_int32_min": lambda: _paged_slot(I32_MIN, torch.int32),
    "paged_slot_2p40_int64": lambda: _paged_slot(2 ** 40, torch.int64),
    "paged_slot_minus_2p40_int64": lambda: _paged_slot(-2 ** 40, torch.int64),
    "paged_slot_int64_max": lambda: _paged_slot(2 ** 63 - 1, torch.int64, idx=0),
    "attn_seqlens_int32_max_contig": lambda: raises(
        ATT, f"cache_seqlens[1] = {I32_MAX} exceeds the cache capacity 32",
        *att_args(lens=[5, I32_MAX])),
    "attn_seqlens_int32_max_paged": lambda: raises(
        ATT, f"cache_seqlens[1] = {I32_MAX} exceeds the cache capacity 32 (max_blocks_per_seq 2 x "
             "block_size 16)", *paged_att(lens=[5, I32_MAX])[0],
        **paged_att(lens=[5, I32_MAX])[1]),
    "attn_block_table_int32_max": lambda: raises(
        ATT, f"block_table[1, 1] = {I32_MAX} is out of range [0, 6)",
        *paged_att(bt=[[3, 0], [5, I32_MAX]])[0], **paged_att(bt=[[3, 0], [5, I32_MAX]])[1]),
    "attn_block_table_int32_min": lambda: raises(
        ATT, f"block_table[0, 0] = {I32_MIN} is out of range [0, 6)",
        *paged_att(bt=[[I32_MIN, 0], [5, 1]])[0], **paged_att(bt=[[I32_MIN, 0], [5, 1]])[1]),
}

@pytest.fixture(scope="module")
def crash_report():
    """Every case of NASTY run in child processes first: name -> None, or how the process died."""
    return crash_isolation.crash_report("test_kvcache_errors", "NASTY", NASTY, timeout=120)


@pytest.mark.parametrize("name", list(NASTY))
def test_overflow_inputs(name, crash_report):
    crash = crash_report.get(name)
    if crash is not None:
        pytest.fail(f"input {name!r} crashed the process: {crash}")
    NASTY[name]()
