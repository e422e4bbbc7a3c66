"""attn_ops.nn.LightningAttention and LinearAttentionState: the module loads transformers'
MiniMaxLightningAttention state dict and matches its block path (prefill) and its token loop (decode);
the state pool allocates, resets, frees and reorders; a decode step compiles with fullgraph=True."""

import pytest
import torch
from transformers import MiniMaxConfig
from transformers.models.minimax.modeling_minimax import MiniMaxCache
from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention as HFLightning

import attn_ops
from attn_ops.nn import LightningAttention, LinearAttentionState, OutOfSlotsError

HIDDEN, HEADS, HEAD_DIM, LAYERS, HF_BLOCK = 32, 4, 8, 4, 16


def hf_layer(layer_idx=1):
    config = MiniMaxConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, head_dim=HEAD_DIM,
                           num_hidden_layers=LAYERS, block_size=HF_BLOCK)
    layer = HFLightning(config, layer_idx).double().eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.3)
    return layer


def ours_like(layer, layer_idx=1):
    mod = LightningAttention(HIDDEN, HEADS, HEAD_DIM, layer_idx=layer_idx, num_layers=LAYERS).double()
    missing, unexpected = mod.load_state_dict(layer.state_dict(), strict=True)
    assert not missing and not unexpected
    return mod


def test_slopes_and_state_dict_names_match_transformers():
    layer = hf_layer(2)
    fresh = LightningAttention(HIDDEN, HEADS, HEAD_DIM, layer_idx=2, num_layers=LAYERS)
    torch.testing.assert_close(fresh.slope, layer.slope_rate.reshape(-1).float())
    mod = ours_like(layer, 2)
    assert set(mod.state_dict()) == set(layer.state_dict()) - {"query_decay", "key_decay", "diagonal_decay"}


@pytest.mark.parametrize("T", [1, HF_BLOCK - 1, 3 * HF_BLOCK + 5])
def test_prefill_matches_transformers_block_loop(T):
    layer = hf_layer()
    mod = ours_like(layer)
    x = torch.randn(2, T, HIDDEN, dtype=torch.float64)
    mask = torch.ones(2, T, dtype=torch.long)
    mask[0, : T // 3] = 0  # left padding
    ref, _ = layer(x, None, mask)
    # transformers' decay tables were computed in float32 at construction (then cast), hence 1e-6.
    torch.testing.assert_close(mod(x, padding_mask=mask), ref, rtol=1e-6, atol=1e-6)


def test_decode_matches_transformers_token_loop():
    layer, T, steps = hf_layer(), 21, 3
    mod = ours_like(layer)
    x = torch.randn(2, T + steps, HIDDEN, dtype=torch.float64)
    cache = MiniMaxCache()
    layer(x[:, :T], None, None, past_key_values=cache)
    pool = LinearAttentionState(LAYERS, 4, HEADS, HEAD_DIM, dtype=torch.float64)
    slots = pool.allocate(2)
    mod(x[:, :T], state=pool, state_indices=slots)
    for t in range(T, T + steps):
        ref, _ = layer(x[:, t:t + 1], None, None, past_key_values=cache)
        out = mod(x[:, t:t + 1], state=pool, state_indices=slots)
        torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)  # the prefill state carries the float32 tables
    torch.testing.assert_close(pool.layer(1)[slots.long()], cache.get_linear_cache(1), rtol=1e-6, atol=1e-6)


def test_module_is_differentiable():
    mod = LightningAttention(HIDDEN, HEADS, HEAD_DIM)
    x = torch.randn(2, 20, HIDDEN, requires_grad=True)
    mod(x).square().mean().backward()
    assert x.grad is not None and mod.qkv_proj.weight.grad is not None and mod.slope_rate.grad is None


def test_state_pool_allocate_free_reset_reorder():
    pool = LinearAttentionState(2, 3, HEADS, HEAD_DIM, 6)
    assert pool.states.shape == (2, 3, HEADS, HEAD_DIM, 6)
    a = pool.allocate(2)
    assert a.dtype == torch.int32 and a.tolist() == [0, 1]
    with pytest.raises(OutOfSlotsError, match=r"^LinearAttentionState.allocate: 2 slots requested, 1 free of 3$"):
        pool.allocate(2)
    pool.states.normal_()
    before = pool.states.clone()
    pool.reorder([0, 1], [1, 1])  # beam search: both beams continue beam 1
    assert torch.equal(pool.states[:, 0], before[:, 1]) and torch.equal(pool.states[:, 1], before[:, 1])
    pool.reset([0])
    assert (pool.states[:, 0] == 0).all() and torch.equal(pool.states[:, 2], before[:, 2])
    pool.free(a)
    with pytest.raises(ValueError, match=r"^LinearAttentionState.free: slots \[0\] are not allocated$"):
        pool.free([0])
    assert pool.allocate(3).tolist() == [2, 0, 1] and (pool.states == 0).all()
    with pytest.raises(ValueError, match=r"^LinearAttentionState.free: slots \[1\] are given more than once$"):
        pool.free([1, 1])  # freed twice, slot 1 would go to two sequences
    pool.free([1, 2])
    assert pool.allocate(2).tolist() == [1, 2]


def test_decode_step_compiles_fullgraph():
    torch._dynamo.reset()
    mod = LightningAttention(HIDDEN, HEADS, HEAD_DIM).eval()
    pool = LinearAttentionState(1, 3, HEADS, HEAD_DIM)
    pool_ref = LinearAttentionState(1, 3, HEADS, HEAD_DIM)
    slots = torch.tensor([2, 0], dtype=torch.int32)
    step = torch.compile(lambda x, p: mod(x, state=p, state_indices=slots), fullgraph=True, dynamic=True)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 1, HIDDEN)
            torch.testing.assert_close(step(x, pool.layer(0)), mod(x, state=pool_ref, state_indices=slots))
    torch.testing.assert_close(pool.states, pool_ref.states)
