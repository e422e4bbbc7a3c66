"""Bad inputs of the serving-batch arguments (cu_seqlens_q, max_seqlen_q, cache_batch_idx,
cache_leftpad), each with its exact message (docs/kvcache_api.md, docs/mla_api.md), and for the
rejected writes a check that nothing was written. (On CUDA the value checks run on the device and end
the CUDA context: they are not tested in-process; the CUDA results are in test_serving_batches.py.)
"""

import pytest
import torch

import attn_ops
from error_helpers import expect_error, i32


def raises(msg, fn, *args, **kw):
    """fn raises msg ("attn_ops.<op>: <message>")."""
    op, message = msg.split(": ", 1)
    expect_error(op.removeprefix("attn_ops."), message, *args, call=fn, **kw)


ATT, MLA = "attn_ops.attention_with_kvcache: ", "attn_ops.mla_decode: "


def att_args():
    """q packed [5, 4, 16] (rows of 1 and 4 queries) over a pool of 4 cache rows of capacity 20."""
    kc, vc = torch.randn(4, 20, 2, 16), torch.randn(4, 20, 2, 16)
    return torch.randn(5, 4, 16), kc, vc, i32([6, 9]), dict(cu_seqlens_q=i32([0, 1, 5]), cache_batch_idx=i32([3, 0]))


@pytest.mark.parametrize("cu,msg", [
    ([0, 1, 4], "cu_seqlens_q must end at the number of tokens in q (5), got 4"),
    ([1, 1, 5], "cu_seqlens_q must start at 0, got 1"),
    ([0, 4, 1], "cu_seqlens_q must be non-decreasing, got cu_seqlens_q[2] = 1 after cu_seqlens_q[1] = 4"),
])
def test_cu_seqlens_q_values(cu, msg):
    q, kc, vc, lens, kw = att_args()
    raises(ATT + msg, attn_ops.attention_with_kvcache, q, kc, vc, lens, **dict(kw, cu_seqlens_q=i32(cu)))


def test_cu_seqlens_q_shapes():
    q, kc, vc, lens, kw = att_args()
    raises(ATT + "cu_seqlens_q must be an int32 tensor of shape [batch + 1], got int64 tensor of shape [3]",
           attn_ops.attention_with_kvcache, q, kc, vc, lens, **dict(kw, cu_seqlens_q=kw["cu_seqlens_q"].long()))
    # three sequences in cu_seqlens_q, two in cache_seqlens
    raises(ATT + "cache_batch_idx must be an int32 tensor of shape [3], got int32 tensor of shape [2]",
           attn_ops.attention_with_kvcache, q, kc, vc, lens, **dict(kw, cu_seqlens_q=i32([0, 1, 2, 5])))
    raises(ATT + "cache_seqlens must be an int32 tensor of shape [3], got int32 tensor of shape [2]",
           attn_ops.attention_with_kvcache, q, kc, vc, lens, cu_seqlens_q=i32([0, 1, 2, 5]),
           cache_batch_idx=i32([3, 0, 1]))
    raises(ATT + "q must be a 3-D tensor [total_q, heads_q, head_dim] when cu_seqlens_q is given, got a 4-D "
           "tensor of shape [1, 5, 4, 16]", attn_ops.attention_with_kvcache, q[None], kc, vc, lens, **kw)
    raises(ATT + "cu_seqlens_q must be on the same device as q (cpu), got meta", attn_ops.attention_with_kvcache,
           q, kc, vc, lens, **dict(kw, cu_seqlens_q=kw["cu_seqlens_q"].to("meta")))


def test_max_seqlen_q():
    q, kc, vc, lens, kw = att_args()
    raises(ATT + "max_seqlen_q (3) is smaller than the longest sequence in cu_seqlens_q (4)",
           attn_ops.attention_with_kvcache, q, kc, vc, lens, max_seqlen_q=3, **kw)
    raises(ATT + "max_seqlen_q must be >= 0, got -1", attn_ops.attention_with_kvcache, q, kc, vc, lens,
           max_seqlen_q=-1, **kw)
    raises(ATT + "max_seqlen_q must be given only with cu_seqlens_q", attn_ops.attention_with_kvcache,
           q.reshape(1, 5, 4, 16), kc[:1], vc[:1], lens[:1], max_seqlen_q=5)


def test_cache_batch_idx_read():
    q, kc, vc, lens, kw = att_args()
    for bad in ([3, 4], [-1, 0]):
        raises(ATT + f"cache_batch_idx[{0 if bad[0] < 0 else 1}] = {bad[0] if bad[0] < 0 else 4} is out of range "
               "[0, 4) (the rows of k_cache)", attn_ops.attention_with_kvcache, q, kc, vc, lens,
               **dict(kw, cache_batch_idx=i32(bad)))
    raises(ATT + "cache_batch_idx must be an int32 tensor of shape [2], got int64 tensor of shape [2]",
           attn_ops.attention_with_kvcache, q, kc, vc, lens, **dict(kw, cache_batch_idx=kw["cache_batch_idx"].long()))
    # paged: the index picks a block-table row
    pk, table = torch.randn(6, 16, 2, 16), i32([[0, 1], [2, 3], [4, 5]])
    raises(ATT + "cache_batch_idx[1] = 3 is out of range [0, 3) (the rows of block_table)",
           attn_ops.attention_with_kvcache, q, pk, pk, lens, block_table=table, **dict(kw, cache_batch_idx=i32([0, 3])))
    # a read may repeat a row (two requests sharing one cached prefix)
    out, _ = attn_ops.attention_with_kvcache(q, kc, vc, lens, **dict(kw, cache_batch_idx=i32([2, 2])))
    assert torch.isfinite(out).all()


def test_cache_leftpad():
    q, kc, vc, lens, kw = att_args()
    raises(ATT + "cache_leftpad[1] = 10 exceeds cache_seqlens[1] = 9 (the keys of row 1 are cache positions "
           "cache_leftpad[1] .. cache_seqlens[1] - 1)", attn_ops.attention_with_kvcache, q, kc, vc, lens,
           cache_leftpad=i32([0, 10]), **kw)
    raises(ATT + "cache_leftpad[0] = -2 must be >= 0", attn_ops.attention_with_kvcache, q, kc, vc, lens,
           cache_leftpad=i32([-2, 1]), **kw)
    raises(ATT + "cache_leftpad must be an int32 tensor of shape [2], got int32 tensor of shape [3]",
           attn_ops.attention_with_kvcache, q, kc, vc, lens, cache_leftpad=i32([0, 1, 2]), **kw)
    # paged: only the blocks from the pad on are read and checked
    pk = torch.randn(6, 16, 2, 16)
    bad_first = i32([[0, 1], [9, 3]])
    raises(ATT + "block_table[1, 0] = 9 is out of range [0, 6)", attn_ops.attention_with_kvcache, q, pk, pk,
           i32([6, 20]), block_table=bad_first, cu_seqlens_q=kw["cu_seqlens_q"], cache_leftpad=i32([0, 15]))
    attn_ops.attention_with_kvcache(q, pk, pk, i32([6, 20]), block_table=bad_first, cu_seqlens_q=kw["cu_seqlens_q"],
                                    cache_leftpad=i32([0, 16]))


def test_mla_decode():
    lc = torch.randn(4, 20, 24)
    ql, qr, lens, cu = torch.randn(5, 2, 16), torch.randn(5, 2, 8), i32([6, 9]), i32([0, 1, 5])
    raises(MLA + "cu_seqlens_q must end at the number of tokens in q (5), got 4", attn_ops.mla_decode, ql, qr, lc,
           lens, scale=0.1, cu_seqlens_q=i32([0, 2, 4]), cache_batch_idx=i32([0, 1]))
    raises(MLA + "cache_batch_idx[0] = 5 is out of range [0, 4) (the rows of latent_cache)", attn_ops.mla_decode,
           ql, qr, lc, lens, scale=0.1, cu_seqlens_q=cu, cache_batch_idx=i32([5, 0]))
    raises(MLA + "cache_leftpad[0] = 7 exceeds cache_seqlens[0] = 6", attn_ops.mla_decode, ql, qr, lc, lens,
           scale=0.1, cu_seqlens_q=cu, cache_batch_idx=i32([1, 0]), cache_leftpad=i32([7, 0]))
    raises(MLA + "q_latent must be a 3-D tensor [total_q, heads, kv_lora_rank] when cu_seqlens_q is given",
           attn_ops.mla_decode, ql[None], qr[None], lc, lens, scale=0.1, cu_seqlens_q=cu)
    raises(MLA + "q_rope must have shape [5, 2, *] (total_q, heads of q_latent), got [5, 3, 8]", attn_ops.mla_decode,
           ql, torch.randn(5, 3, 8), lc, lens, scale=0.1, cu_seqlens_q=cu)


# --------------------------------------------------------------------------------------------------
# Writes: rejected before anything is written
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("idx,msg", [
    ([3, 4], "cache_batch_idx[1] = 4 is out of range [0, 4) (the rows of k_cache)"),
    ([3], "cache_batch_idx must be an int32 tensor of shape [2], got int32 tensor of shape [1]"),
])
def test_kv_cache_append_batch_idx(idx, msg):
    kc, vc, k = torch.randn(4, 20, 2, 16), torch.randn(4, 20, 2, 16), torch.randn(2, 1, 2, 16)
    before = kc.clone(), vc.clone()
    raises("attn_ops.kv_cache_append: " + msg, attn_ops.kv_cache_append, kc, vc, k, k, i32([6, 9]),
           cache_batch_idx=i32(idx))
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])


def test_kv_cache_append_batch_idx_shapes_and_capacity():
    kc, vc = torch.randn(4, 20, 2, 16), torch.randn(4, 20, 2, 16)
    before = kc.clone()
    raises("attn_ops.kv_cache_append: k must have shape [*, *, 2, 16] (heads_kv, head_dim of k_cache), got "
           "[2, 1, 3, 16]", attn_ops.kv_cache_append, kc, vc, torch.randn(2, 1, 3, 16), torch.randn(2, 1, 2, 16),
           i32([6, 9]), cache_batch_idx=i32([3, 1]))
    # the last row overflows: nothing is written, not even the first row's tokens
    k = torch.randn(2, 3, 2, 16)
    raises("attn_ops.kv_cache_append: cache_seqlens[1] = 18 plus 3 new tokens exceeds the cache capacity 20",
           attn_ops.kv_cache_append, kc, vc, k, k, i32([0, 18]), cache_batch_idx=i32([3, 1]))
    assert torch.equal(kc, before)


def test_mla_cache_append_batch_idx():
    lc = torch.randn(4, 20, 24)
    before = lc.clone()
    raises("attn_ops.mla_cache_append: cache_batch_idx[1] = 1 repeats cache_batch_idx[0]: the rows of one write "
           "must be distinct cache rows", attn_ops.mla_cache_append, lc, torch.randn(2, 1, 16), torch.randn(2, 1, 8),
           cache_seqlens=i32([6, 9]), cache_batch_idx=i32([1, 1]))
    raises("attn_ops.mla_cache_append: cache_batch_idx selects rows of a contiguous cache; with slot_mapping (paged "
           "cache) the slots already say where each token goes", attn_ops.mla_cache_append, lc, torch.randn(2, 16),
           torch.randn(2, 8), slot_mapping=i32([1, 2]), cache_batch_idx=i32([1, 0]))
    raises("attn_ops.mla_cache_append: cache_batch_idx[0] = 4 is out of range [0, 4) (the rows of latent_cache)",
           attn_ops.mla_cache_append, lc, torch.randn(2, 1, 16), torch.randn(2, 1, 8), cache_seqlens=i32([6, 9]),
           cache_batch_idx=i32([4, 0]))
    assert torch.equal(lc, before)


def test_meta_tensors_check_shapes_only():
    """Under fake / meta tensors only the shape checks run (no values), as for every other index argument."""
    q, kc, vc, lens, kw = att_args()
    out, lse = attn_ops.attention_with_kvcache(q.to("meta"), kc.to("meta"), vc.to("meta"), lens.to("meta"),
                                               cu_seqlens_q=i32([0, 1, 5], "meta"), cache_batch_idx=i32([9, 9], "meta"))
    assert out.shape == (5, 4, 16) and lse.shape == (4, 5)
