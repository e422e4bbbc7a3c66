"""lightning_attention and lightning_attention_decode_ against the float64 token recurrence
(tests/lightning_reference.py): lengths around the block size, Dk != Dv, slope 0 and MiniMax's slopes,
initial states, GQA groups, packed varlen with an empty sequence, every dtype, decode into a state pool."""

import pytest
import torch

import attn_ops
from lightning_reference import assert_close_rule, minimax_slopes, recurrence

BLOCK = 16
EPS = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def make(shape, dtype=torch.float32, scale=0.5):
    return (torch.randn(shape, dtype=torch.float64) * scale).to(dtype)


def slopes(kind, heads):
    return torch.zeros(heads) if kind == "zero" else minimax_slopes(heads, 1, 4)


@pytest.mark.parametrize("T", [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 5])
@pytest.mark.parametrize("slope_kind", ["zero", "minimax"])
@pytest.mark.parametrize("with_init", [False, True])
def test_forward_float64_matches_recurrence(T, slope_kind, with_init):
    B, H, Hk, Dk, Dv = 2, 4, 2, 12, 20
    q, k, v = (make((B, T, H, Dk), torch.float64), make((B, T, Hk, Dk), torch.float64),
               make((B, T, Hk, Dv), torch.float64))
    s = slopes(slope_kind, H)
    init = make((B, H, Dk, Dv), torch.float64) if with_init else None
    out, final = attn_ops.lightning_attention(q, k, v, s, scale=0.3, initial_state=init, block_size=BLOCK)
    ref_out, ref_final = recurrence(q, k, v, s, scale=0.3, initial_state=init)
    assert out.shape == (B, T, H, Dv) and final.shape == (B, H, Dk, Dv) and final.dtype == torch.float64
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final, ref_final, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("Hk", [1, 2, 4])
def test_forward_low_precision_tolerance_rule(dtype, Hk, device):
    B, T, H, Dk, Dv = 2, 3 * BLOCK + 5, 4, 16, 24
    q, k, v = make((B, T, H, Dk), dtype), make((B, T, Hk, Dk), dtype), make((B, T, Hk, Dv), dtype)
    s = minimax_slopes(H)
    init = make((B, H, Dk, Dv), torch.float32)
    out, final = attn_ops.lightning_attention(q.to(device), k.to(device), v.to(device), s.to(device),
                                              scale=Dk ** -0.5, initial_state=init.to(device), block_size=BLOCK)
    out, final = out.cpu(), final.cpu()
    assert out.dtype == dtype and final.dtype == torch.float32
    ref_out, ref_final = recurrence(q, k, v, s, scale=Dk ** -0.5, initial_state=init, round_out=False)
    # the documented computation: a float32 state, the output rounded to q's dtype once (a whole bfloat16
    # recurrence drifts so far that a 10% error in the decay passed the rule)
    same_out, same_final = recurrence(q, k, v, s, scale=Dk ** -0.5, initial_state=init, compute_dtype=torch.float32)
    assert_close_rule(out, ref_out, same_out, EPS[dtype] * (1 + ref_out.abs().max().item()))
    assert_close_rule(final, ref_final, same_final, EPS[dtype] * (1 + ref_final.abs().max().item()))


def test_default_block_long_sequence_and_strided_inputs():
    # T beyond several default blocks; q/k/v are transposed [B, H, T, D] views (no copy).
    B, T, H, Dk, Dv = 1, 200, 2, 32, 16
    q = make((B, H, T, Dk), torch.float64).transpose(1, 2)
    k = make((B, H, T, Dk), torch.float64).transpose(1, 2)
    v = make((B, H, T, Dv), torch.float64).transpose(1, 2)
    s = minimax_slopes(H)
    out, final = attn_ops.lightning_attention(q, k, v, s)
    ref_out, ref_final = recurrence(q, k, v, s)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final, ref_final, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("block", [1, 5, 64, 1000])
def test_block_size_does_not_change_the_result(block):
    q, k, v = make((2, 37, 2, 8), torch.float64), make((2, 37, 1, 8), torch.float64), make((2, 37, 1, 8), torch.float64)
    s = minimax_slopes(2)
    out, final = attn_ops.lightning_attention(q, k, v, s, block_size=block)
    ref_out, ref_final = recurrence(q, k, v, s)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final, ref_final, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_varlen_with_empty_sequence(dtype, device):
    lens = [5, 0, 2 * BLOCK + 3, 1]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    N, H, Hk, Dk, Dv = sum(lens), 4, 1, 8, 12
    q, k, v = make((N, H, Dk), dtype), make((N, Hk, Dk), dtype), make((N, Hk, Dv), dtype)
    s = minimax_slopes(H)
    sdt = torch.float64 if dtype == torch.float64 else torch.float32
    init = make((len(lens), H, Dk, Dv), sdt)
    out, final = attn_ops.lightning_attention(q.to(device), k.to(device), v.to(device), s.to(device),
                                              initial_state=init.to(device), cu_seqlens=cu.to(device),
                                              max_seqlen=max(lens), block_size=BLOCK)
    out, final = out.cpu(), final.cpu()
    ref_out, ref_final = recurrence(q, k, v, s, initial_state=init, cu_seqlens=cu)
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    torch.testing.assert_close(out, ref_out.to(dtype), rtol=tol, atol=tol)
    torch.testing.assert_close(final, ref_final.to(sdt), rtol=tol, atol=tol)
    torch.testing.assert_close(final[1], init[1])  # the empty sequence keeps its state


def test_varlen_offsets_given_as_a_strided_view(device):
    """cu_seqlens need not be contiguous (every 2nd element of a longer tensor): the kernels read its values,
    not its storage in order (CUDA read cu[b] at stride 1, out of bounds for such a view)."""
    lens = [3, 0, 9]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    strided = torch.stack([cu, torch.full_like(cu, 10_000)], 1).reshape(-1)[::2]
    assert not strided.is_contiguous() and torch.equal(strided, cu)
    N, H, Dk, Dv = sum(lens), 2, 8, 4
    q, k, v = make((N, H, Dk), torch.float64), make((N, 1, Dk), torch.float64), make((N, 1, Dv), torch.float64)
    s = minimax_slopes(H)
    leaves = [t.to(device).requires_grad_() for t in (q, k, v)]
    out, final = attn_ops.lightning_attention(*leaves, s.to(device), cu_seqlens=strided.to(device), block_size=4)
    ref_out, ref_final = recurrence(q, k, v, s, cu_seqlens=cu)
    torch.testing.assert_close(out.cpu(), ref_out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final.cpu(), ref_final, rtol=1e-10, atol=1e-10)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad((out * dout).sum(), leaves)
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_grads = torch.autograd.grad((recurrence(*ref_leaves, s, cu_seqlens=cu)[0] * dout.cpu()).sum(), ref_leaves)
    for ours, ref in zip(grads, ref_grads):
        torch.testing.assert_close(ours.cpu(), ref, rtol=1e-9, atol=1e-9)


def test_nan_propagates_only_forward_in_time():
    q, k, v = make((1, 40, 1, 8)), make((1, 40, 1, 8)), make((1, 40, 1, 8))
    k[0, 20, 0, 3] = float("nan")
    out, final = attn_ops.lightning_attention(q, k, v, minimax_slopes(1), block_size=BLOCK)
    assert not out[0, :20].isnan().any()
    assert out[0, 20:].isnan().all()
    assert final.isnan().any()


@pytest.mark.parametrize("Tq", [1, 3, 20])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_decode_updates_the_pool_in_place(Tq, dtype, device):
    B, N, H, Hk, Dk, Dv = 3, 5, 4, 2, 8, 16
    sdt = torch.float64 if dtype == torch.float64 else torch.float32
    q, k, v = make((B, Tq, H, Dk), dtype), make((B, Tq, Hk, Dk), dtype), make((B, Tq, Hk, Dv), dtype)
    s = minimax_slopes(H)
    before = make((N, H, Dk, Dv), sdt)
    pool = before.clone().to(device)
    idx = torch.tensor([3, -1, 0], dtype=torch.int32)
    out = attn_ops.lightning_attention_decode_(q.to(device), k.to(device), v.to(device), pool, s.to(device),
                                               scale=0.7, state_indices=idx.to(device)).cpu()
    pool = pool.cpu()
    init = before[idx.long().clamp(min=0)]
    if dtype == torch.float64:
        ref_out, ref_final = recurrence(q, k, v, s, scale=0.7, initial_state=init)
        torch.testing.assert_close(out[[0, 2]], ref_out[[0, 2]], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(pool[[3, 0]], ref_final[[0, 2]], rtol=1e-10, atol=1e-10)
    else:  # the forward's rule: the float32-state computation, the output rounded once (fixed tolerances let a
        # 3% output error pass in bfloat16)
        ref_out, ref_final = recurrence(q, k, v, s, scale=0.7, initial_state=init, round_out=False)
        same_out, same_final = recurrence(q, k, v, s, scale=0.7, initial_state=init, compute_dtype=torch.float32)
        assert_close_rule(out[[0, 2]], ref_out[[0, 2]], same_out[[0, 2]],
                          EPS[dtype] * (1 + ref_out.abs().max().item()))
        assert_close_rule(pool[[3, 0]], ref_final[[0, 2]], same_final[[0, 2]],
                          EPS[dtype] * (1 + ref_final.abs().max().item()))
    assert (out[1] == 0).all()  # a skipped row outputs zeros
    assert torch.equal(pool[[1, 2, 4]], before[[1, 2, 4]])  # untouched slots stay bit-identical


@pytest.mark.parametrize("Tq", [3, 20])
def test_decode_head_dim_1_on_a_transposed_pool(Tq):
    """head_dim 1 with the pool a transposed view ([N, H, Dv, 1].transpose(2, 3)): its size-1 row dim has stride 1,
    legal, but the in-place block path (Tq > 8) gave that stride to BLAS as the leading dimension; MKL refused
    the call with only a printed message and the pool stayed unchanged. Such a pool now runs on a copy."""
    N, H, Dv = 2, 2, 16
    f64 = torch.float64
    q, k, v = make((N, Tq, H, 1), f64), make((N, Tq, H, 1), f64), make((N, Tq, H, Dv), f64)
    s = minimax_slopes(H)
    before = make((N, H, 1, Dv), f64)
    pool = torch.empty(N, H, Dv, 1, dtype=f64).transpose(2, 3).copy_(before)  # strides (H * Dv, Dv, 1, 1)
    assert pool.stride() == (H * Dv, Dv, 1, 1)
    out = attn_ops.lightning_attention_decode_(q, k, v, pool, s)
    ref_out, ref_final = recurrence(q, k, v, s, initial_state=before)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(pool, ref_final, rtol=1e-10, atol=1e-10)


def test_decode_without_indices_equals_prefill_continuation():
    # Prefill T tokens, then decode 2 more one at a time: the same as one prefill over T + 2.
    B, T, H, Dk, Dv = 2, 30, 2, 8, 8
    q, k, v = make((B, T + 2, H, Dk)), make((B, T + 2, H, Dk)), make((B, T + 2, H, Dv))
    s = minimax_slopes(H)
    full, full_state = attn_ops.lightning_attention(q, k, v, s)
    out, state = attn_ops.lightning_attention(q[:, :T], k[:, :T], v[:, :T], s)
    steps = [attn_ops.lightning_attention_decode_(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], state, s)
             for t in (T, T + 1)]
    torch.testing.assert_close(torch.cat([out] + steps, 1), full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, full_state, rtol=1e-5, atol=1e-5)
