"""CUDA: bad index values are rejected on the device, without a host synchronisation.

For CUDA inputs the value checks of index tensors (cache_seqlens, block tables, slot mappings,
positions, cu_seqlens, lightning's state_indices) and of lightning's slope run in a small kernel before
the op's first write kernel; at the first bad value it prints the host check's message and fails a
device-side assert (csrc/common/cuda/index_checks.h).
That ends the process's CUDA context, so every rejection runs in a child process here: the child must
fail and print the exact message. (That the caches are left unchanged cannot be read back after the
assert; it follows from stream order: the check kernel asserts before the write kernel is launched.)

And the point of it: an eager decode step of GroupedQueryAttention with a KVCache, and of
MultiHeadLatentAttention with a LatentKVCache, runs under torch.cuda.set_sync_debug_mode("error").
Skipped without a GPU.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import attn_ops
from attn_ops.nn import GroupedQueryAttention, KVCache, LatentKVCache, MultiHeadLatentAttention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")

DEV = "cuda"
BF16 = torch.bfloat16

# name: (statements run in the child on CUDA, the message the device check must print)
REJECTIONS = {
    "paged_append_slot": (
        "kc = torch.randn(6, 16, 2, 8, device=d); vc = torch.randn_like(kc)\n"
        "k = torch.randn(5, 2, 8, device=d)\n"
        "s = torch.tensor([3, 17, -1, 96, 5], dtype=torch.int32, device=d)\n"
        "attn_ops.paged_kv_cache_append(kc, vc, k, k.clone(), s)",
        "attn_ops.paged_kv_cache_append: slot_mapping[3] = 96 is out of range: the cache has 96 slots "
        "(num_blocks 6 x block_size 16); -1 skips a token"),
    "append_overfull": (
        "kc = torch.randn(2, 16, 2, 8, device=d); vc = torch.randn_like(kc)\n"
        "k = torch.randn(2, 3, 2, 8, device=d)\n"
        "attn_ops.kv_cache_append(kc, vc, k, k.clone(), torch.tensor([2, 14], dtype=torch.int32, device=d))",
        "attn_ops.kv_cache_append: cache_seqlens[1] = 14 plus 3 new tokens exceeds the cache capacity 16"),
    "mla_append_slot": (
        "cache = torch.randn(6, 16, 576, dtype=torch.bfloat16, device=d)\n"
        "c = torch.randn(5, 512, dtype=torch.bfloat16, device=d); "
        "p = torch.randn(5, 64, dtype=torch.bfloat16, device=d)\n"
        "attn_ops.mla_cache_append(cache, c, p, "
        "slot_mapping=torch.tensor([3, 17, -1, 96, 5], dtype=torch.int64, device=d))",
        "attn_ops.mla_cache_append: slot_mapping[3] = 96 is out of range: the cache has 96 slots"),
    "kvcache_length": (
        "q = torch.randn(2, 1, 4, 64, device=d); kc = torch.randn(2, 16, 2, 64, device=d)\n"
        "attn_ops.attention_with_kvcache(q, kc, kc.clone(), torch.tensor([3, 17], dtype=torch.int32, device=d))",
        "attn_ops.attention_with_kvcache: cache_seqlens[1] = 17 exceeds the cache capacity 16"),
    "kvcache_block_table": (
        "q = torch.randn(2, 1, 4, 64, device=d); kc = torch.randn(6, 16, 2, 64, device=d)\n"
        "bt = torch.tensor([[3, 0], [7, 1]], dtype=torch.int32, device=d)\n"
        "attn_ops.attention_with_kvcache(q, kc, kc.clone(), torch.tensor([20, 5], dtype=torch.int32, device=d), "
        "block_table=bt)",
        "attn_ops.attention_with_kvcache: block_table[1, 0] = 7 is out of range [0, 6)"),
    "mla_decode_length": (
        "ql = torch.randn(2, 1, 4, 512, dtype=torch.bfloat16, device=d)\n"
        "qr = torch.randn(2, 1, 4, 64, dtype=torch.bfloat16, device=d)\n"
        "cache = torch.randn(2, 16, 576, dtype=torch.bfloat16, device=d)\n"
        "attn_ops.mla_decode(ql, qr, cache, torch.tensor([-1, 3], dtype=torch.int32, device=d), scale=0.1)",
        "attn_ops.mla_decode: cache_seqlens[0] = -1 must be >= 0"),
    "kvcache_batch_idx": (
        "q = torch.randn(2, 1, 4, 64, device=d); kc = torch.randn(3, 16, 2, 64, device=d)\n"
        "i = torch.tensor([2, 3], dtype=torch.int32, device=d)\n"
        "attn_ops.attention_with_kvcache(q, kc, kc.clone(), torch.tensor([3, 5], dtype=torch.int32, device=d), "
        "cache_batch_idx=i)",
        "attn_ops.attention_with_kvcache: cache_batch_idx[1] = 3 is out of range [0, 3) (the rows of k_cache)"),
    "kvcache_leftpad": (
        "q = torch.randn(2, 1, 4, 64, device=d); kc = torch.randn(2, 16, 2, 64, device=d)\n"
        "p = torch.tensor([1, 6], dtype=torch.int32, device=d)\n"
        "attn_ops.attention_with_kvcache(q, kc, kc.clone(), torch.tensor([3, 5], dtype=torch.int32, device=d), "
        "cache_leftpad=p)",
        "attn_ops.attention_with_kvcache: cache_leftpad[1] = 6 exceeds cache_seqlens[1] = 5 (the keys of row 1 are "
        "cache positions cache_leftpad[1] .. cache_seqlens[1] - 1)"),
    "kvcache_selected_block_table": (
        "q = torch.randn(2, 1, 4, 64, device=d); kc = torch.randn(6, 16, 2, 64, device=d)\n"
        "bt = torch.tensor([[3, 0], [7, 9], [2, 1]], dtype=torch.int32, device=d)\n"
        "i = torch.tensor([2, 1], dtype=torch.int32, device=d); "
        "p = torch.tensor([0, 16], dtype=torch.int32, device=d)\n"
        "attn_ops.attention_with_kvcache(q, kc, kc.clone(), torch.tensor([20, 20], dtype=torch.int32, device=d), "
        "block_table=bt, cache_batch_idx=i, cache_leftpad=p)",
        "attn_ops.attention_with_kvcache: block_table[1, 1] = 9 is out of range [0, 6)"),
    "append_batch_idx_repeat": (  # kv_cache_append accepts repeated rows (test_kvcache_duplicate_rows.py)
        "lc = torch.randn(4, 16, 24, device=d)\n"
        "attn_ops.mla_cache_append(lc, torch.randn(3, 1, 16, device=d), torch.randn(3, 1, 8, device=d), "
        "cache_seqlens=torch.tensor([0, 1, 2], dtype=torch.int32, device=d), "
        "cache_batch_idx=torch.tensor([3, 0, 3], dtype=torch.int32, device=d))",
        "attn_ops.mla_cache_append: cache_batch_idx[2] = 3 repeats cache_batch_idx[0]: the rows of one write must be "
        "distinct cache rows"),
    "rotary_position": (
        "cos, sin = attn_ops.rotary_cos_sin(16, 8, device=d)\n"
        "x = torch.randn(2, 3, 2, 8, device=d)\n"
        "attn_ops.rotary_embedding_(x, cos, sin, torch.tensor([[0, 1, 2], [3, 16, 4]], device=d))",
        "attn_ops.rotary_embedding_: positions[1, 1] = 16 is out of range [0, 16) of the cos/sin table"),
    "cu_seqlens_order": (
        "q = torch.randn(6, 2, 64, device=d)\n"
        "cu = torch.tensor([0, 4, 2, 6], dtype=torch.int32, device=d)\n"
        "attn_ops.attention(q, q.clone(), q.clone(), cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=6, max_seqlen_k=6)",
        "attn_ops.attention: cu_seqlens_q must be non-decreasing, got cu_seqlens_q[2] = 2 after cu_seqlens_q[1] = 4"),
    "max_seqlen_small": (
        "q = torch.randn(6, 2, 64, device=d)\n"
        "cu = torch.tensor([0, 1, 6], dtype=torch.int32, device=d)\n"
        "attn_ops.attention(q, q.clone(), q.clone(), cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=3, max_seqlen_k=5)",
        "attn_ops.attention: max_seqlen_q (3) is smaller than the longest sequence in cu_seqlens_q (5)"),
    "lightning_cu_seqlens_end": (
        "q = torch.randn(10, 4, 16, device=d); v = torch.randn(10, 4, 24, device=d)\n"
        "attn_ops.lightning_attention(q, q.clone(), v, torch.rand(4, device=d), "
        "cu_seqlens=torch.tensor([0, 4, 12], dtype=torch.int32, device=d))",
        "attn_ops.lightning_attention: cu_seqlens must end at the number of tokens in q (10), got 12"),
    "lightning_slope": (
        "q = torch.randn(2, 5, 4, 16, device=d); v = torch.randn(2, 5, 4, 24, device=d)\n"
        "attn_ops.lightning_attention(q, q.clone(), v, torch.tensor([0.1, 0.2, -0.5, 0.3], device=d))",
        "attn_ops.lightning_attention: slope[2] = -0.5 must be finite and >= 0"),
    "lightning_decode_slot_range": (
        "q = torch.randn(3, 1, 4, 16, device=d); v = torch.randn(3, 1, 4, 24, device=d)\n"
        "pool = torch.randn(5, 4, 16, 24, device=d)\n"
        "attn_ops.lightning_attention_decode_(q, q.clone(), v, pool, torch.rand(4, device=d), "
        "state_indices=torch.tensor([3, 5, 0], dtype=torch.int32, device=d))",
        "attn_ops.lightning_attention_decode_: state_indices[1] = 5 is out of range [-1, 5) of the state pool; "
        "-1 skips a row"),
    "lightning_decode_slot_repeat": (
        "q = torch.randn(3, 1, 4, 16, device=d); v = torch.randn(3, 1, 4, 24, device=d)\n"
        "pool = torch.randn(5, 4, 16, 24, device=d)\n"
        "attn_ops.lightning_attention_decode_(q, q.clone(), v, pool, torch.rand(4, device=d), "
        "state_indices=torch.tensor([3, -1, 3], dtype=torch.int32, device=d))",
        "attn_ops.lightning_attention_decode_: state_indices[2] = 3 repeats state_indices[0]: two rows cannot update "
        "one slot"),
}

_CHILD = """
import torch, attn_ops
d = "cuda"
{body}
torch.cuda.synchronize()
print("NOT REJECTED", flush=True)
"""


@pytest.mark.parametrize("case", list(REJECTIONS))
def test_bad_value_asserts_with_message(case):
    body, message = REJECTIONS[case]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.run([sys.executable, "-c", _CHILD.format(body=textwrap.dedent(body))],
                           capture_output=True, text=True, timeout=120, env=env)
    output = child.stdout + child.stderr
    assert child.returncode != 0 and "NOT REJECTED" not in output, output
    assert message in output, output


def run_without_sync(step):
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()


def test_gqa_decode_step_makes_no_sync():
    layer = GroupedQueryAttention(256, 4, 2, device=DEV, dtype=BF16)
    cache = KVCache(1, 2, 64, 2, 64, dtype=BF16, device=DEV)
    with torch.no_grad():
        layer(torch.randn(2, 5, 256, device=DEV, dtype=BF16), cache=cache)    # prefill
        run_without_sync(lambda: layer(torch.randn(2, 1, 256, device=DEV, dtype=BF16), cache=cache))


def test_mla_decode_step_makes_no_sync():
    layer = MultiHeadLatentAttention(256, 4, None, 512, 64, 64, 64, device=DEV, dtype=BF16)
    cache = LatentKVCache(1, 2, 64, 512, 64, dtype=BF16, device=DEV)
    with torch.no_grad():
        layer(torch.randn(2, 5, 256, device=DEV, dtype=BF16), cache=cache)    # prefill
        run_without_sync(lambda: layer(torch.randn(2, 1, 256, device=DEV, dtype=BF16), cache=cache))


def test_varlen_with_max_seqlen_makes_no_sync():
    q = torch.randn(9, 4, 64, device=DEV, dtype=BF16)
    cu = torch.tensor([0, 2, 2, 9], dtype=torch.int32, device=DEV)
    run_without_sync(lambda: attn_ops.attention(q, q.clone(), q.clone(), causal=True, cu_seqlens_q=cu,
                                                cu_seqlens_k=cu, max_seqlen_q=7, max_seqlen_k=7)[0])
