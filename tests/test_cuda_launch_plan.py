"""CUDA launch decisions that correctness tests alone cannot see, read back from the launch record
(torch.ops.attn_ops._cuda_last_launch, CUDA builds only), each with the result checked against the
float64 reference as well. Skipped without a GPU.

- MLA decode (576/512) reads V from the K tile ("V inside K"): one copy of each cache tile, 111 KB
  of shared memory instead of 176 KB.
- Split-KV is decided per row on the device from cache_seqlens: the host only sizes the grid (from the
  capacity) and the minimum split length (from the partial traffic).
- The tensor-core backward of MQA/GQA splits the group's query heads over blocks when the key tiles
  alone cannot fill the GPU.
"""

import pytest
import torch

import attn_ops
from kvcache_reference import kvcache_inputs
from mla_reference import mla_inputs
from reference import assert_close_to_ref, attention_ref, dense_inputs
from test_attention_with_kvcache import check_kvcache
from test_mla_ops import check_mla, scale_for

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")

DEV = "cuda"
BF16 = torch.bfloat16


def last_launch(kernel):
    """[dims..., decisions...] of the last launch of `kernel` (launch_record.h)."""
    return list(torch.ops.attn_ops._cuda_last_launch(torch.empty(0, device=DEV), kernel))


# Tile<576, 512, 2, 2, 32> of forward_mma.cu with V from K: (32 + 2 * 3 * 32) row offsets of 8 bytes,
# 8 words of key bits, Q + 2 K tiles of 32 rows with a pitch of 584 bf16.
MLA_SMEM_V_IN_K = (32 + 2 * 3 * 32) * 8 + 8 * 4 + (32 + 2 * 32) * 584 * 2


@pytest.mark.parametrize("block_size", [None, 64], ids=["contiguous", "paged64"])
def test_mla_decode_reads_values_from_keys(block_size):
    ql, qr, cache, sl, bt, _ = mla_inputs(3, 1, 16, 512, 64, [37, 1, 300], dtype=BF16, device=DEV,
                                          block_size=block_size)
    check_mla(ql, qr, cache, sl, bt, scale=scale_for(512, 64))
    dqk, dv, v_in_k, smem = last_launch("forward_mma")[:4]
    assert (dqk, dv) == (576, 512)
    assert v_in_k == 1, "MLA decode copied V separately"
    assert smem == MLA_SMEM_V_IN_K


def test_split_kv_follows_lengths_not_capacity():
    # A 2k-token row in a 32k cache: the grid is sized for the capacity, each row splits its own keys.
    q, kc, vc, sl, bt = kvcache_inputs(1, 1, 32, 8, 128, 128, [2048], dtype=BF16, device=DEV,
                                       capacity=32768)
    check_kvcache(q, kc, vc, sl, bt)
    rec = last_launch("forward_mma")
    assert rec[4] > 1 and rec[5] == 256, rec


@pytest.mark.parametrize("block_size", [None, 16], ids=["contiguous", "paged16"])
def test_split_kv_rows_of_every_length(block_size):
    # lengths around the key tile (64) and the minimum split (256), empty rows, and one long row.
    lens = [0, 1, 63, 64, 65, 257, 2049, 5000]
    q, kc, vc, sl, bt = kvcache_inputs(len(lens), 1, 8, 2, 128, 128, lens, dtype=BF16, device=DEV,
                                       capacity=8192, block_size=block_size)
    check_kvcache(q, kc, vc, sl, bt)
    assert last_launch("forward_mma")[4] > 1


def test_mla_split_minimum_follows_partial_traffic():
    # 128 heads: 128 fp32 partial rows of 512 per split cost as much as ~1k keys of the cache.
    ql, qr, cache, sl, bt, _ = mla_inputs(1, 1, 128, 512, 64, [4096], dtype=BF16, device=DEV)
    check_mla(ql, qr, cache, sl, bt, scale=scale_for(512, 64))
    rec = last_launch("forward_mma")
    assert rec[5] == 1024 and rec[4] > 1, rec


@pytest.mark.parametrize("heads_kv,split", [(1, True), (32, False)], ids=["mqa", "mha"])
def test_backward_splits_query_heads(heads_kv, split):
    B, T, Hq, D = 1, 200, 32, 64
    q, k, v = dense_inputs(B, T, T, Hq, heads_kv, D, D, BF16, DEV)
    dout = torch.randn(B, T, Hq, D, device=DEV).to(BF16)
    ours = [t.detach().requires_grad_() for t in (q, k, v)]
    out, _ = attn_ops.attention(*ours, causal=True)
    grads = torch.autograd.grad(out, ours, dout)
    assert last_launch("backward_mma")[:2] == [64, 64]
    head_splits = last_launch("backward_mma")[2]
    assert (head_splits > 1) == split, head_splits
    refs = []
    for cdt in (torch.float64, torch.float32):  # ref64, then the rule's baseline (float32, rounded once below)
        ins = [t.detach().to(cdt).requires_grad_() for t in (q, k, v)]
        r_out, _ = attention_ref(*ins, causal=True, compute_dtype=cdt)
        refs.append(torch.autograd.grad(r_out, ins, dout.to(cdt)))
    refs[1] = tuple(g.to(BF16) for g in refs[1])
    for name, a, r64, same in zip(("dq", "dk", "dv"), grads, *refs):
        assert_close_to_ref(a, r64, same, name=name, rounded_intermediates=True)
