"""attn_ops.integrations.deepseek: transformers DeepSeek-V2/V3 models with attn_ops MLA swapped in,
against transformers' own eager model (tiny random models: 2 dense layers, hidden 64, 4 heads,
kv_lora_rank 32, qk_rope 16, qk_nope 32, v 32; initializer_range 0.2 so that attention moves the logits).

* forward logits, cached (absorbed, the default under no_grad) and uncached (expanded) paths, for V3
  (q_lora_rank 32; q_lora_rank None with YaRN and attention bias) and V2 (complex rotary), YaRN with
  mscale != mscale_all_dim (an attention factor != 1 in cos/sin and a softmax scale != 1/sqrt(d));
  padded batches;
* greedy generate(): the same tokens as transformers (no padding in float32/float64, left padding,
  beam search, prompt-lookup decoding, which crops the cache); the latent cache then takes
  (kv_lora_rank + qk_rope_head_dim) * element size bytes per token and layer, measured against
  transformers' own cache after the same generation, and its rows hold what transformers cached;
* gradients of the uncached path; the swap keeps the same parameter tensors; errors.

Tolerance (tests/reference.py): |ours - ref64| <= 2 * |same_dtype - ref64| + eps, same_dtype =
transformers' eager model in the test's dtype, ref64 = transformers' sdpa model in float64 (eager
rounds its softmax to float32 even for float64). transformers computes rotary angles in float32 and
DeepSeek-V2 even rounds q and k to float32 to rotate them; ref64 computes both in float64 (fixtures
below), or it would differ from a float64 model by float32 rounding and the rule would compare noise.
Left padding is tested in float32 only: transformers'
eager model gives NaN logits for left-padded float64 batches (a fully masked padding row's float64
minimum becomes -inf in its float32 softmax, and 0 * NaN then reaches the real tokens).

ref64's rotary frequencies and attention factor come from the config through rope_reference's formulas
(default and YaRN), not from transformers' rotary module, and every config has a non-default rope_theta: an
integration rotating with tables of its own (theta 10000, no scaling) instead of the model's
position_embeddings fails.
"""
import copy
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import (DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config,  # noqa: E402
                          DeepseekV3ForCausalLM, DynamicCache)
from transformers.models.deepseek_v2 import modeling_deepseek_v2  # noqa: E402

from attn_ops.integrations.deepseek import (DeepseekLatentCache, DeepseekMLAAttention,  # noqa: E402
                                            swap_deepseek_attention)
from reference import assert_close_to_ref  # noqa: E402
from rope_reference import default_inv_freq, yarn_attention_factor, yarn_inv_freq  # noqa: E402

F32_F64 = [torch.float32, torch.float64]
F32_F64_IDS = ["f32", "f64"]
VOCAB = 128
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, qk_rope_head_dim=16,
              qk_nope_head_dim=32, v_head_dim=32,
              first_k_dense_replace=2, max_position_embeddings=128, initializer_range=0.2, pad_token_id=0,
              eos_token_id=None, attn_implementation="eager")
DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 1e6}
YARN = {"rope_type": "yarn", "rope_theta": 5e4, "factor": 4.0, "original_max_position_embeddings": 32,
        "mscale": 1.0, "mscale_all_dim": 0.8}
CONFIGS = {
    "v3": (DeepseekV3Config, DeepseekV3ForCausalLM, dict(q_lora_rank=32, rope_parameters=DEFAULT_ROPE)),
    "v3_yarn_bias": (DeepseekV3Config, DeepseekV3ForCausalLM,
                     dict(q_lora_rank=None, rope_parameters=YARN, attention_bias=True)),
    "v2": (DeepseekV2Config, DeepseekV2ForCausalLM, dict(q_lora_rank=None, rope_parameters=DEFAULT_ROPE)),
    "v2_yarn": (DeepseekV2Config, DeepseekV2ForCausalLM, dict(q_lora_rank=16, rope_parameters=YARN)),
}


def build(name, dtype=torch.float32, device="cpu", **overrides):
    """(transformers' eager model, a deep copy with swapped attention)."""
    config_cls, model_cls, extra = CONFIGS[name]
    hf = model_cls(config_cls(**{**COMMON, **extra, **overrides})).eval().to(device=device, dtype=dtype)
    return hf, swap_deepseek_attention(copy.deepcopy(hf))


def config_rope(config):
    """(float64 inv_freq [rope / 2], attention factor) of the config's rope_parameters, from the formulas."""
    p, dim = config.rope_parameters, config.qk_rope_head_dim
    if p["rope_type"] == "default":
        return torch.tensor(default_inv_freq(dim, p["rope_theta"]), dtype=torch.float64), 1.0
    assert p["rope_type"] == "yarn", p
    inv_freq = yarn_inv_freq(dim, p["rope_theta"], p["factor"], p["original_max_position_embeddings"])
    return (torch.tensor(inv_freq, dtype=torch.float64),
            yarn_attention_factor(p["factor"], p.get("mscale"), p.get("mscale_all_dim")))


def float64_rotary(rotary, config):
    """Makes transformers' rotary module compute its angles in float64 (float32 by design), with the
    config's frequencies and attention factor from the formulas instead of its own."""
    inv_freq, scale = config_rope(config)

    def forward(x, position_ids):
        freqs = position_ids.double()[..., None] * inv_freq.to(position_ids.device)
        if isinstance(rotary, modeling_deepseek_v2.DeepseekV2RotaryEmbedding):  # complex rotation factors
            return torch.polar(torch.ones_like(freqs), freqs) * scale
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * scale).to(x.dtype), (emb.sin() * scale).to(x.dtype)
    rotary.forward = forward


def sdpa64(hf):
    """The float64 reference: transformers' sdpa model in float64, rotary included."""
    ref = copy.deepcopy(hf).double()
    ref.set_attn_implementation("sdpa")
    float64_rotary(ref.model.rotary_emb, ref.config)
    return ref


_v2_apply_rotary_emb = modeling_deepseek_v2.apply_rotary_emb


def _v2_apply_rotary_emb_float64(xq, xk, freqs_cis):
    """DeepSeek-V2's rotation without its float32 rounding of float64 q / k (other dtypes as before)."""
    if xq.dtype != torch.float64:
        return _v2_apply_rotary_emb(xq, xk, freqs_cis)
    f = freqs_cis.unsqueeze(1).to(torch.complex128)
    rotate = lambda x: torch.view_as_real(torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2)) * f).flatten(3)  # noqa: E731
    return rotate(xq), rotate(xk)


@pytest.fixture(autouse=True)
def _deepseek_v2_rotates_float64_in_float64(monkeypatch):
    monkeypatch.setattr(modeling_deepseek_v2, "apply_rotary_emb", _v2_apply_rotary_emb_float64)


def left_padded(B=3, T=10, pads=(0, 3, 6), device="cpu"):
    ids = torch.randint(1, VOCAB, (B, T), device=device)
    mask = torch.ones(B, T, dtype=torch.long, device=device)
    for b, p in enumerate(pads):
        ids[b, :p], mask[b, :p] = 0, 0
    return ids, mask


def greedy(model, ids, **kwargs):
    with torch.no_grad():
        return model.generate(ids, do_sample=False, max_new_tokens=8, return_dict_in_generate=True,
                              **kwargs)


# --------------------------------------------------------------------------------------------------
# (a) forward logits
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", F32_F64, ids=F32_F64_IDS)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward_logits(name, dtype, device):
    hf, ours = build(name, dtype, device)
    ids = torch.randint(1, VOCAB, (2, 12), device=device)
    with torch.no_grad():
        ref64, same = sdpa64(hf)(ids).logits, hf(ids).logits
        cached = ours(ids)
        assert isinstance(cached.past_key_values, DeepseekLatentCache)
        assert cached.past_key_values.get_seq_length() == 12
        assert_close_to_ref(cached.logits, ref64, same, name="cached (absorbed) logits")
        expanded = ours(ids, use_cache=False)
        assert expanded.past_key_values is None
        assert_close_to_ref(expanded.logits, ref64, same, name="uncached (expanded) logits")


@pytest.mark.parametrize("name", ["v3", "v2_yarn"])
def test_padded_forward(name):
    """Left padding, and right padding in row 0 (the pads go behind the real tokens either way)."""
    hf, ours = build(name)
    ids, mask = left_padded()
    mask[0, -2:] = 0
    real = mask.bool()
    with torch.no_grad():
        ref64, same = sdpa64(hf)(ids, attention_mask=mask).logits, hf(ids, attention_mask=mask).logits
        cached = ours(ids, attention_mask=mask)
        expanded = ours(ids, attention_mask=mask, use_cache=False)
    assert_close_to_ref(cached.logits[real], ref64[real], same[real], name="cached logits")
    assert_close_to_ref(expanded.logits[real], ref64[real], same[real], name="expanded logits")
    for layer in cached.past_key_values.layers:  # the padding is not cached
        assert layer.latent.seqlens.tolist() == real.sum(1).tolist()


# --------------------------------------------------------------------------------------------------
# (b) greedy generation, (c) the cache it leaves
# --------------------------------------------------------------------------------------------------
def hf_rope_layout(k_pe, name):
    """Our cached k_pe (interleaved pairs) in the feature order transformers caches: DeepSeek-V3
    de-interleaves it (evens, then odds), V2 keeps the pairs."""
    return torch.cat((k_pe[..., 0::2], k_pe[..., 1::2]), -1) if name.startswith("v3") else k_pe


def assert_cache_rows(cache, hf_cache, ref_cache, name, pads):
    """Row b of every layer of our cache holds transformers' cached latents of its real tokens (the
    reference rule against the float64 sdpa model's cache, the eager model's as same_dtype).

    transformers' DeepSeek-V2 rotates in float32 whatever the dtype (a complex64 product), so its
    float64 k_pe is only float32-accurate: eps is then float32 rounding."""
    S = hf_cache.get_seq_length()
    dc = cache.layers[0].kv_lora_rank
    float32_rope = name.startswith("v2") and hf_cache.layers[0].values.dtype == torch.float64
    for layer, hf_layer, ref_layer in zip(cache.layers, hf_cache.layers, ref_cache.layers):
        assert layer.latent.seqlens.tolist() == [S - p for p in pads]
        for b, p in enumerate(pads):
            rows = layer.latent.latent[0][b, :S - p]
            assert_close_to_ref(rows[:, :dc], ref_layer.keys[b, 0, p:], hf_layer.keys[b, 0, p:],
                                name="c_kv")
            ref_k_pe = ref_layer.values[b, 0, p:]
            eps = 1e-6 * max(1.0, ref_k_pe.abs().max().item()) if float32_rope else None
            assert_close_to_ref(hf_rope_layout(rows[:, dc:], name), ref_k_pe, hf_layer.values[b, 0, p:],
                                eps=eps, name="k_pe")


@pytest.mark.parametrize("dtype", F32_F64, ids=F32_F64_IDS)
@pytest.mark.parametrize("name", ["v3", "v2_yarn"])
def test_generate_greedy_and_cache_size(name, dtype, device):
    hf, ours = build(name, dtype, device)
    cfg = hf.config
    ids = torch.randint(1, VOCAB, (2, 6), device=device)
    theirs, ref = greedy(hf, ids), greedy(sdpa64(hf), ids)
    mine = greedy(ours, ids)
    assert torch.equal(mine.sequences, theirs.sequences)
    assert torch.equal(ref.sequences, theirs.sequences)  # (the reference cache is for the same tokens)

    cache, hf_cache = mine.past_key_values, theirs.past_key_values
    assert isinstance(cache, DeepseekLatentCache) and type(hf_cache) is DynamicCache
    S = hf_cache.get_seq_length()  # the last generated token is never fed back
    assert S == 6 + 8 - 1 and cache.get_seq_length() == S
    element = torch.finfo(dtype).bits // 8
    latent_row = (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * element
    assert cache.bytes_per_token == cfg.num_hidden_layers * latent_row
    hf_bytes_per_token = sum(layer.keys.nbytes + layer.values.nbytes for layer in hf_cache.layers) / (2 * S)
    # transformers 5 caches DeepSeek's compressed latent as well (and re-expands the per-head K/V of the
    # whole cache with kv_b_proj at every step): the same bytes per token
    assert hf_bytes_per_token / cache.bytes_per_token == 1.0
    # both are heads * (nope + rope + v) / (kv_lora_rank + rope) = 20/3 times smaller than per-head K/V
    per_head_kv = cfg.num_hidden_layers * cfg.num_attention_heads * (
        cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim) * element
    assert per_head_kv / cache.bytes_per_token == pytest.approx(20 / 3)
    assert_cache_rows(cache, hf_cache, ref.past_key_values, name, pads=(0, 0))


def test_generate_over_8bit_latent_cache():
    """DeepseekLatentCache(dtype=float8_e4m3fn, kv_scale=...): every layer's rows are stored in one byte per value
    (layer 0's prompt rows, which depend on the tokens alone, byte for byte the quantized rows of a full-width
    prefill of the same prompt), and the logits stay close to the full-width cache's (a read without the scale
    would be off by a factor of 1 / kv_scale)."""
    _, ours = build("v3")
    cfg = ours.config
    ids = torch.randint(1, VOCAB, (2, 6))
    kv_scale, fmt = 0.02, torch.float8_e4m3fn
    cache8 = DeepseekLatentCache(cfg, dtype=fmt, kv_scale=kv_scale)
    mine8 = greedy(ours, ids, past_key_values=cache8, output_logits=True)
    assert mine8.sequences.shape == (2, 6 + 8)
    assert all(layer.latent.dtype == fmt for layer in cache8.layers)
    assert cache8.bytes_per_token == cfg.num_hidden_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    cache32 = DeepseekLatentCache(cfg)
    with torch.no_grad():
        logits32 = ours(ids, past_key_values=cache32).logits[:, -1]
    rows32 = cache32.layers[0].latent.latent[0][:, :6]
    rows8 = cache8.layers[0].latent.latent[0][:, :6]
    want = (rows32 / kv_scale).clamp(-448, 448).to(fmt)
    assert torch.equal(rows8.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8))
    rel = float((mine8.logits[0] - logits32).abs().max() / logits32.abs().max())
    assert rel < 0.1, rel


@pytest.mark.parametrize("name", ["v3_yarn_bias", "v2"])
def test_generate_left_padded(name, device):
    hf, ours = build(name, device=device)
    pads = (0, 2, 5)
    ids, mask = left_padded(pads=pads, device=device)
    theirs, ref = greedy(hf, ids, attention_mask=mask), greedy(sdpa64(hf), ids, attention_mask=mask)
    # an explicit cache sized for the whole generation: never reallocated
    cache = DeepseekLatentCache(ours.config, max_cache_len=10 + 8)
    mine = greedy(ours, ids, attention_mask=mask, past_key_values=cache)
    assert torch.equal(mine.sequences, theirs.sequences)
    assert torch.equal(ref.sequences, theirs.sequences)
    assert mine.past_key_values is cache
    assert all(layer.latent.capacity == 18 for layer in cache.layers)
    assert_cache_rows(cache, theirs.past_key_values, ref.past_key_values, name, pads)


def test_beam_search():
    hf, ours = build("v3")
    ids = torch.randint(1, VOCAB, (2, 5))
    kwargs = dict(num_beams=3, num_return_sequences=2)
    assert torch.equal(greedy(ours, ids, **kwargs).sequences, greedy(hf, ids, **kwargs).sequences)


def test_prompt_lookup_decoding_crops(monkeypatch):
    hf, ours = build("v2")
    ids = torch.randint(1, VOCAB, (1, 4)).repeat(1, 3)  # repeats: the lookup finds candidates
    crops = []
    crop = DeepseekLatentCache.crop
    monkeypatch.setattr(DeepseekLatentCache, "crop", lambda self, n: (crops.append(n), crop(self, n))[1])
    theirs = greedy(hf, ids, prompt_lookup_num_tokens=3)
    mine = greedy(ours, ids, prompt_lookup_num_tokens=3)
    assert torch.equal(mine.sequences, theirs.sequences)
    assert any(n < 0 for n in crops), "no candidate was rejected: the test does not reach crop()"


# --------------------------------------------------------------------------------------------------
# training path, weights
# --------------------------------------------------------------------------------------------------
def test_gradients_of_uncached_path():
    hf, ours = build("v3")
    ids = torch.randint(1, VOCAB, (2, 9))
    ref = sdpa64(hf)
    for model in (hf, ours, ref):
        model(ids, labels=ids).loss.backward()  # grad mode: the swapped model makes no cache
    ref_grads = dict(ref.named_parameters())
    for (name, p), (hf_name, q) in zip(ours.named_parameters(), hf.named_parameters()):
        assert name == hf_name
        if ".self_attn." in name:
            assert_close_to_ref(p.grad, ref_grads[name].grad, q.grad, name=name)


def test_swap_keeps_parameter_tensors():
    hf, _ = build("v3_yarn_bias")
    before = dict(hf.named_parameters())
    assert swap_deepseek_attention(hf) is hf
    after = dict(hf.named_parameters())
    assert list(after) == list(before) and all(after[n] is before[n] for n in before)
    attn = hf.model.layers[1].self_attn
    assert isinstance(attn, DeepseekMLAAttention) and attn.layer_idx == 1
    yarn_mscale = 0.1 * 0.8 * math.log(4.0) + 1  # YaRN: factor 4, mscale_all_dim 0.8
    assert attn.softmax_scale == pytest.approx((32 + 16) ** -0.5 * yarn_mscale ** 2)


# --------------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------------
def test_swap_errors():
    hf, ours = build("v3")
    with pytest.raises(ValueError, match="already has swapped attention"):
        swap_deepseek_attention(ours)
    with pytest.raises(TypeError, match="must contain a transformers DeepseekV2Model or .* got Linear"):
        swap_deepseek_attention(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="hf_attention must be a DeepseekV2Attention or .* got Linear"):
        DeepseekMLAAttention(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="config.rope_interleave must be True"):
        build("v3", rope_interleave=False)
    with pytest.raises(ValueError, match=r"max_cache_len must be None or an int >= 1, got 0"):
        DeepseekLatentCache(hf.config, max_cache_len=0)


def test_forward_errors():
    hf, ours = build("v3")
    ids = torch.randint(1, VOCAB, (2, 5))
    with torch.no_grad():
        with pytest.raises(ValueError, match="output_attentions=True is not supported"):
            ours(ids, output_attentions=True)
        with pytest.raises(ValueError, match=r"2-D padding mask .* got shape \[2, 1, 5, 5\]"):
            ours(ids, attention_mask=torch.zeros(2, 1, 5, 5))
        filled = hf(ids).past_key_values
        with pytest.raises(TypeError, match="got a DynamicCache holding 5 tokens"):
            ours(ids, past_key_values=filled)
        with pytest.raises(TypeError, match="an unswapped attention layer called update"):
            hf(ids, past_key_values=DeepseekLatentCache(hf.config))
        cache = ours(ids).past_key_values
        with pytest.raises(ValueError, match="inputs have batch size 1, .* holds 5 tokens of batch size 2"):
            ours(ids[:1], past_key_values=cache)
    dropout = build("v3", attention_dropout=0.1)[1].train()
    with pytest.raises(ValueError, match="attention_dropout: the swapped attention has no dropout"):
        dropout(ids, use_cache=False)
