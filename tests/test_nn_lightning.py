"""attn_ops.nn.LightningAttention and LinearAttentionState: the module loads transformers'
MiniMaxLightningAttention state dict and matches its block path (prefill) and its token loop (decode);
the state pool allocates, resets, frees and reorders; a decode step compiles with fullgraph=True."""

import pytest
import torch
from transformers import MiniMaxConfig
from transformers.models.minimax.modeling_minimax import MiniMaxCache
from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention as HFLightning

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


@pytest.mark.parametrize("dtype, device", [(torch.bfloat16, None), (torch.float64, None), (None, "meta")])
def test_module_factory_arguments_reach_every_parameter(dtype, device):
    """The output norm ignored dtype= and device= (a bfloat16 module failed in its forward)."""
    mod = LightningAttention(HIDDEN, HEADS, HEAD_DIM, dtype=dtype, device=device)
    for name, p in mod.named_parameters():
        assert p.dtype == (dtype or torch.float32) and p.device.type == (device or "cpu"), name
    if device is None:
        assert mod(torch.randn(2, 5, HIDDEN, dtype=dtype)).dtype == dtype


def test_module_sizes_checked():
    with pytest.raises(ValueError, match=r"^head_dim must be an int >= 1, got 0$"):  # it fell back to 32 // 4
        LightningAttention(32, 4, head_dim=0)
    with pytest.raises(ValueError, match=r"^num_heads must be an int >= 1, got 0$"):
        LightningAttention(32, 0)


def test_module_is_differentiable():
    mod = LightningAttention(HIDDEN, HEADS, HEAD_DIM)
    x = torch.randn(2, 20, HIDDEN, requires_grad=True)
    mod(x).square().mean().backward()
    assert x.grad is not None and mod.qkv_proj.weight.grad is not None and mod.slope_rate.grad is None


def test_state_pool_allocate_free_reset_reorder():
    pool = LinearAttentionState(2, 3, HEADS, HEAD_DIM, 6)
    assert pool.num_layers == 2 and [p.shape for p in pool.states] == [(3, HEADS, HEAD_DIM, 6)] * 2
    assert pool.states[0].data_ptr() != pool.states[1].data_ptr() and pool.layer(1) is pool.states[1]
    a = pool.allocate(2)
    assert a.dtype == torch.int32 and a.tolist() == [0, 1]
    with pytest.raises(OutOfSlotsError, match=r"^LinearAttentionState.allocate: 2 slots requested, 1 free of 3$"):
        pool.allocate(2)
    for p in pool.states:
        p.normal_()
    before = [p.clone() for p in pool.states]
    pool.reorder([0, 1], [1, 1])  # beam search: both beams continue beam 1
    for p, b in zip(pool.states, before):
        assert torch.equal(p[0], b[1]) and torch.equal(p[1], b[1]) and torch.equal(p[2], b[2])
    pool.reset([0])
    for p, b in zip(pool.states, before):
        assert (p[0] == 0).all() and torch.equal(p[1], b[1]) and torch.equal(p[2], b[2])
    pool.free(a)
    with pytest.raises(ValueError, match=r"^LinearAttentionState.free: slots \[0\] are not allocated$"):
        pool.free([0])
    assert pool.allocate(3).tolist() == [2, 0, 1] and all((p == 0).all() for p in pool.states)
    with pytest.raises(ValueError, match=r"^LinearAttentionState.free: slots \[1\] are given more than once$"):
        pool.free([1, 1])  # freed twice, slot 1 would go to two sequences
    pool.free([1, 2])
    assert pool.allocate(2).tolist() == [1, 2]


def test_state_pool_rejects_bad_slots():
    """allocate(-1) handed out all but one slot (negative slicing), a negative slot counted from the end, and
    reorder broadcast one source into several slots."""
    pool = LinearAttentionState(1, 4, HEADS, HEAD_DIM)
    with pytest.raises(ValueError, match=r"^n must be an int >= 0, got -1$"):
        pool.allocate(-1)
    assert pool.allocate(0).tolist() == []
    with pytest.raises(ValueError, match=r"^LinearAttentionState.reset: slots \[-1, 4\] are out of range \[0, 4\)$"):
        pool.reset([0, -1, 4])
    with pytest.raises(ValueError, match=r"^LinearAttentionState.reorder: source must be a list or 1-D tensor of slot "
                                         r"numbers, got torch.float32 of shape \(1,\)$"):
        pool.reorder([0], [1.5])
    pool.states[0].normal_()
    before = pool.states[0].clone()
    with pytest.raises(ValueError, match=r"^LinearAttentionState.reorder: slots and source must have one entry each "
                                         r"per slot, got 2 and 1$"):
        pool.reorder([0, 1], [2])
    assert torch.equal(pool.states[0], before)
    pool.reset([])
    assert torch.equal(pool.states[0], before)


@pytest.mark.parametrize("arg, value", [("num_layers", 0), ("num_slots", 0), ("num_heads", -1), ("head_dim", 2.0),
                                        ("head_dim_v", 0), ("head_dim_v", True)])
def test_state_pool_rejects_bad_sizes(arg, value):
    kw = dict(num_layers=2, num_slots=3, num_heads=HEADS, head_dim=HEAD_DIM, head_dim_v=None)
    kw[arg] = value
    with pytest.raises(ValueError, match=rf"^{arg} must be an int >= 1, got {value!r}$"):
        LinearAttentionState(**kw)


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
    torch.testing.assert_close(pool.layer(0), pool_ref.layer(0))


@pytest.mark.parametrize("dynamic", [None, True])
def test_layer_stack_decode_compiles_with_one_pool(dynamic):
    # Every layer after the first advances its own pool under torch.compile, dynamic shapes included: Inductor
    # (torch 2.14) drops the storage offset of a mutated view under dynamic=True, so the pool of layer i must
    # not be a view into one [L, ...] tensor.
    torch._dynamo.reset()
    stack = torch.nn.ModuleList(LightningAttention(HIDDEN, HEADS, HEAD_DIM, layer_idx=i, num_layers=3)
                                for i in range(3)).eval()
    pool, pool_ref = LinearAttentionState(3, 3, HEADS, HEAD_DIM), LinearAttentionState(3, 3, HEADS, HEAD_DIM)
    slots = torch.tensor([2, 0], dtype=torch.int32)

    def step(x, p):
        for layer in stack:
            x = x + layer(x, state=p, state_indices=slots)
        return x

    compiled = torch.compile(step, fullgraph=True, dynamic=dynamic)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 1, HIDDEN)
            torch.testing.assert_close(compiled(x, pool), step(x, pool_ref))
    for i in range(3):
        torch.testing.assert_close(pool.layer(i), pool_ref.layer(i))
        assert pool.layer(i)[slots.long()].abs().sum() > 0
