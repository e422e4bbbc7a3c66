"""attn_implementation="attn_ops" in HuggingFace transformers (attn_ops.integrations.transformers).

Tiny randomly initialised models built from configs (no download): Llama (GQA), Mistral (sliding
window smaller than the prompt), Qwen2 (q/k/v bias; layer 0 full, layer 1 sliding), Gemma-2
(logit softcap, sliding/full layers, query_pre_attn_scalar scaling) and gpt-oss (attention sinks on
sliding and full layers). Weights are drawn with a large
initializer_range so that attention logits are O(1): softcap, scaling and masks all change the
result well beyond the tolerances.

Everything is compared with transformers' own "eager" attention, under the tolerance rule of
tests/reference.py, max|ours - ref64| <= 2 * max|same_dtype - ref64| + eps:
  ref64      eager on a float64 copy of the model;
  same_dtype eager in the test dtype (for float64 that is ref64 itself: the bound is eps).
Eager rounds its softmax through float32 even for float64 inputs (and with padding its float64
mask value then overflows to -inf, giving NaN rows), so this module makes torch's softmax keep
float64 inputs in float64: eager becomes a float64 ground truth. (sdpa cannot serve: it ignores
Gemma-2's softcap.) Only real (non-padding) positions are compared: padding positions' outputs
are meaningless and differ between transformers' own implementations too.
"""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_ops.integrations.transformers as hf  # noqa: E402
from reference import assert_close_to_ref  # noqa: E402

COMMON = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              initializer_range=0.2, pad_token_id=0)
MODELS = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", {}),
    "mistral": ("MistralForCausalLM", "MistralConfig", {"sliding_window": 4}),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config",
              {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config",
               {"head_dim": 16, "sliding_window": 4, "attn_logit_softcapping": 1.5,
                "final_logit_softcapping": None, "query_pre_attn_scalar": 8}),
    # learned attention sinks (s_aux) on sliding and full layers, MoE MLP
    "gpt_oss": ("GptOssForCausalLM", "GptOssConfig",
                {"head_dim": 16, "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"],
                 "num_local_experts": 4, "num_experts_per_tok": 2}),
    # Llama 4 text: a chunked layer (chunks of 4, RoPE, QK-norm) and a full NoPE layer with temperature tuning
    "llama4": ("Llama4ForCausalLM", "Llama4TextConfig",
               {"head_dim": 16, "attention_chunk_size": 4, "no_rope_layers": [1, 0], "num_local_experts": 2,
                "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "intermediate_size_mlp": 96}),
}
BATCH, PROMPT = 3, 10
PADDINGS = [None, "left", "right"]


_SOFTMAX = torch.nn.functional.softmax


def _softmax_keeping_float64(input, dim=None, _stacklevel=3, dtype=None):
    """torch's softmax, except that float64 inputs are not rounded to a lower `dtype`."""
    if input.dtype == torch.float64:
        dtype = None
    return _SOFTMAX(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)


@pytest.fixture(autouse=True, scope="module")
def _setup():
    """Register attn_ops, make eager float64-exact, and run on one thread: these models are so
    small that a thread pool only adds overhead (50x on a busy 2-core machine)."""
    hf.register()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.nn.functional, "softmax", _softmax_keeping_float64)
        yield
    torch.set_num_threads(threads)


def build(name, dtype):
    """A randomly initialised model of MODELS[name] in `dtype`, and its float64 copy."""
    model_cls, config_cls, extra = MODELS[name]
    config = getattr(transformers, config_cls)(**COMMON, **extra)
    config._experts_implementation = "eager"  # gpt-oss's MoE: grouped_mm has no float64
    model32 = getattr(transformers, model_cls)(config).eval()
    model64 = copy.deepcopy(model32).double()
    return (model64 if dtype == torch.float64 else model32.to(dtype)), model64


def prompt(padding):
    """Token ids [BATCH, PROMPT] and a 2-D attention_mask (None, or rows padded on one side by
    different amounts, one row unpadded)."""
    ids = torch.randint(1, COMMON["vocab_size"], (BATCH, PROMPT))
    if padding is None:
        return ids, None
    mask = torch.ones(BATCH, PROMPT, dtype=torch.long)
    if padding == "left":
        mask[0, :4] = 0
        mask[2, :1] = 0
    else:
        mask[1, 7:] = 0
        mask[2, 9:] = 0
    return ids.masked_fill(mask == 0, COMMON["pad_token_id"]), mask


def real_positions(ids, mask):
    return torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()


def logits(model, implementation, ids, mask):
    model.set_attn_implementation(implementation)
    with torch.no_grad():
        return model(ids, attention_mask=mask).logits


# --------------------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", MODELS)
def test_logits_match_transformers(name, dtype, padding):
    model, model64 = build(name, dtype)
    ids, mask = prompt(padding)
    real = real_positions(ids, mask)
    ours = logits(model, "attn_ops", ids, mask)
    ref64 = logits(model64, "eager", ids, mask)
    same = logits(model, "eager", ids, mask)
    assert_close_to_ref(ours[real], ref64[real], same[real], name=f"{name} logits")


def test_masks_change_the_result():
    """The comparisons above can fail: dropping the padding mask or the sliding window is caught."""
    model, _ = build("mistral", torch.float32)
    ids, mask = prompt("left")
    ours = logits(model, "attn_ops", ids, mask)
    unpadded = logits(model, "attn_ops", ids, None)
    assert (ours[0, 4:] - unpadded[0, 4:]).abs().max() > 1e-2
    model.config.sliding_window = None
    no_window = logits(model, "attn_ops", ids, None)
    assert (no_window[:, 4:] - unpadded[:, 4:]).abs().max() > 1e-2


def test_sinks_change_the_result():
    """gpt-oss's comparisons can fail: dropping its attention sinks (a -inf sink weighs nothing) is caught."""
    model, _ = build("gpt_oss", torch.float32)
    ids, _ = prompt(None)
    ours = logits(model, "attn_ops", ids, None)
    for layer in model.model.layers:
        layer.self_attn.sinks.data.fill_(float("-inf"))
    assert (logits(model, "attn_ops", ids, None) - ours).abs().max() > 1e-2


# --------------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("padding", [None, "left"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", MODELS)
def test_greedy_generate_matches_transformers(name, dtype, padding, cache):
    """Same tokens as transformers' eager attention, with a DynamicCache (the keys passed in are
    the whole cache so far; sliding layers keep only the window) or a StaticCache (masks built
    ahead by generate; the keys are the whole preallocated buffer); and every step's logits under the
    tolerance rule, ref64 being the float64 model's full forward over the generated tokens (the same
    tokens alone let a 3% error in the decode steps' attention pass)."""
    model, model64 = build(name, dtype)
    ids, mask = prompt(padding)
    new = 8

    def generate(implementation):
        model.set_attn_implementation(implementation)
        return model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                              cache_implementation=cache, output_logits=True, return_dict_in_generate=True)

    if name == "llama4" and cache == "static":
        # transformers 5.17's generate builds a static cache's masks with block_sequence_ids, which
        # create_chunked_causal_mask does not take: Llama 4 cannot generate so with any attention (checked here)
        with pytest.raises(TypeError, match="block_sequence_ids"):
            generate("eager")
        pytest.skip("transformers 5.17: Llama 4 has no static-cache generation (TypeError above, in eager too)")
    expected, ours = generate("eager"), generate("attn_ops")
    assert expected.sequences.shape == (BATCH, PROMPT + new)
    assert torch.equal(ours.sequences, expected.sequences)
    full_mask = None if mask is None else torch.cat([mask, torch.ones(BATCH, new, dtype=mask.dtype)], 1)
    # generate's positions: counted over real tokens only (left padding)
    positions = None if full_mask is None else (full_mask.cumsum(-1) - 1).clamp(min=0)
    model64.set_attn_implementation("eager")
    with torch.no_grad():
        ref64 = model64(expected.sequences, attention_mask=full_mask, position_ids=positions).logits
    assert_close_to_ref(torch.stack(ours.logits, 1), ref64[:, PROMPT - 1:PROMPT + new - 1],
                        torch.stack(expected.logits, 1), name="logits")


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------
def labels_for(ids, mask):
    """Next-token labels that only read the logits of real positions: -100 where the token or the
    one before it (whose logits predict it) is padding."""
    if mask is None:
        return ids
    prev_pad = torch.nn.functional.pad(mask[:, :-1], (1, 0), value=1) == 0
    return ids.masked_fill((mask == 0) | prev_pad, -100)


def gradients(model, implementation, ids, mask):
    model.train()
    model.set_attn_implementation(implementation)
    model.zero_grad()
    model(ids, attention_mask=mask, labels=labels_for(ids, mask)).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", MODELS)
def test_training_gradients_match_transformers(name, dtype, padding):
    model, model64 = build(name, dtype)
    ids, mask = prompt(padding)
    ours = gradients(model, "attn_ops", ids, mask)
    ref64 = gradients(model64, "eager", ids, mask)
    same = gradients(model, "eager", ids, mask)
    assert ours.keys() == ref64.keys() == dict(model.named_parameters()).keys()
    for param in ref64:
        assert_close_to_ref(ours[param], ref64[param], same[param], name=f"{name} d{param}")


def test_torch_compile_fullgraph_training_step():
    """torch.compile(fullgraph=True) of a whole Llama, forward and backward, with and without
    padding: zero graph breaks, and the logits and gradients of eager transformers.

    The aot_eager backend traces exactly what inductor would get (dynamo's graph, AOTAutograd's
    joint forward/backward through the ops' fake kernels) without generating C++ code, which takes
    minutes on a small CPU machine.
    """
    from torch._dynamo.utils import counters

    model, model64 = build("llama", torch.float32)
    model.config.use_cache = model64.config.use_cache = False
    model.train()
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for padding in (None, "left"):
        ids, mask = prompt(padding)
        real = real_positions(ids, mask)
        labels = labels_for(ids, mask)
        model.set_attn_implementation("attn_ops")
        model.zero_grad()
        out = compiled(ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        ref64 = logits(model64, "eager", ids, mask)
        same = logits(model, "eager", ids, mask)
        assert_close_to_ref(out.logits.detach()[real], ref64[real], same[real], name="logits")
        ref64_grads = gradients(model64, "eager", ids, mask)
        same_grads = gradients(model, "eager", ids, mask)
        for param in ref64_grads:
            assert_close_to_ref(grads[param], ref64_grads[param], same_grads[param], name=param)
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 2
    # a mask the layout cannot express is still rejected inside the compiled graph
    ids, mask = prompt("left")
    holes = mask.clone()
    holes[1, 5] = 0
    model.set_attn_implementation("attn_ops")  # logits() / gradients() left it at "eager"
    with pytest.raises(RuntimeError, match="one contiguous run"):
        compiled(ids, attention_mask=holes, labels=labels_for(ids, holes))


# --------------------------------------------------------------------------------------------------
# Registration and rejected inputs
# --------------------------------------------------------------------------------------------------
def test_register_is_idempotent_and_selects_attn_ops():
    assert hf.register() == hf.register() == "attn_ops"
    config = transformers.LlamaConfig(**COMMON, attn_implementation="attn_ops")
    assert transformers.LlamaForCausalLM(config).config._attn_implementation == "attn_ops"


def test_dropout_in_training_is_rejected():
    model, _ = build("llama", torch.float32)
    model.config.attention_dropout = 0.1
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    ids, _ = prompt(None)
    model.set_attn_implementation("attn_ops")
    model.train()
    with pytest.raises(ValueError, match=r"attn_ops attention has no dropout, got dropout=0\.1"):
        model(ids)
    model.eval()
    model(ids)  # dropout is 0 in eval mode


def test_unsupported_masks_are_rejected():
    model, _ = build("llama", torch.float32)
    model.set_attn_implementation("attn_ops")
    ids, mask = prompt("left")
    holes = mask.clone()
    holes[1, 5] = 0
    with pytest.raises(ValueError, match="one contiguous run"):
        model(ids, attention_mask=holes)
    # Two sequences packed in each row; transformers looks for them only without a cache.
    packed = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5]]).expand(BATCH, -1)
    with pytest.raises(ValueError, match="packed sequences"):
        model(ids, position_ids=packed, use_cache=False)
    dense = torch.ones(BATCH, 1, PROMPT, PROMPT, dtype=torch.bool).tril()
    with pytest.raises(ValueError, match=r"int32 \[batch, 4, 1, 1\] padding layout .* got "
                                         r"torch\.bool of shape \[3, 1, 10, 10\]"):
        model(ids, attention_mask=dense)


def test_prefix_lm_block_mask_is_rejected():
    """A block mask (PaliGemma's image and prefix tokens see each other both ways, the rest is causal) passes
    the "sees the token before" check; it must still be refused, not run as plain causal."""
    from transformers.masking_utils import create_causal_mask
    model, _ = build("llama", torch.float32)
    model.config._attn_implementation = "attn_ops"
    embeds = torch.zeros(1, 6, COMMON["hidden_size"])
    with pytest.raises(ValueError, match="prefix-LM or block mask"):
        create_causal_mask(model.config, embeds, None, None, block_sequence_ids=torch.tensor([[0, 0, 0, -1, -1, -1]]))


@pytest.mark.parametrize("target_len", [5, 8, 11], ids=["shorter", "same", "longer"])
def test_cross_attention_pads_only_encoder_keys(target_len):
    """An encoder-decoder (Bart): the cross-attention's mask is the source padding, its queries are decoder
    tokens. Padding in the source must hide those keys only, not mark decoder queries as padding (which zeroed
    them), and a decoder longer than the source must not index past the source mask."""
    config = transformers.BartConfig(vocab_size=50, d_model=32, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                     decoder_ffn_dim=32, max_position_embeddings=64, init_std=0.3)
    model = transformers.BartForConditionalGeneration(config).eval().double()
    source, target = torch.randint(3, 50, (2, 8)), torch.randint(3, 50, (2, target_len))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, 3:] = 0
    outs = {}
    for implementation in ("eager", "attn_ops"):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            outs[implementation] = model(input_ids=source, attention_mask=mask, decoder_input_ids=target).logits
    torch.testing.assert_close(outs["attn_ops"], outs["eager"], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("padding", ["left", "right"])
def test_bidirectional_sliding_window_encoder_with_padding(padding):
    """ModernBERT's local layers: a bidirectional window over padded rows. Every query of a bidirectional mask is
    real but only the real keys are, and the op aligns a window bottom-right, so right-padded rows (how BERT-style
    tokenizers pad) had every window shifted by the padding: max error 1.8 on real tokens."""
    config = transformers.ModernBertConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                           num_attention_heads=4, local_attention=4, global_attn_every_n_layers=3,
                                           max_position_embeddings=64, initializer_range=0.2, pad_token_id=0,
                                           bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
    model = transformers.ModernBertModel(config).eval().double()
    ids = torch.randint(3, 97, (3, 12))
    mask = torch.ones(3, 12, dtype=torch.long)
    pads = {0: 5, 1: 2}  # row 2 unpadded
    for row, n in pads.items():
        mask[row, :n] = 0 if padding == "left" else 1
        if padding == "right":
            mask[row, 12 - n:] = 0
    outs = {}
    for implementation in ("eager", "attn_ops"):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            outs[implementation] = model(ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(outs["attn_ops"][real], outs["eager"][real], rtol=1e-10, atol=1e-10)


def test_output_attentions_warns():
    """output_attentions=True was ignored without a word; transformers' sdpa and flash paths warn."""
    model, _ = build("llama", torch.float32)
    model.set_attn_implementation("attn_ops")
    with pytest.warns(UserWarning, match=r"does not return attention weights \(output_attentions=True\)"):
        with torch.no_grad():
            model(torch.randint(1, 97, (1, 4)), output_attentions=True)


def test_one_token_rows_laid_out_token_major_without_cache():
    """Keys of one position are contiguous either way by is_contiguous(); Llama's (a view of the projection,
    token-major) must not take the head-major in-place path, which read out of bounds."""
    model, model64 = build("llama", torch.float32)
    ids, mask = torch.randint(1, 97, (3, 1)), torch.tensor([[0], [1], [1]])
    model.set_attn_implementation("attn_ops")
    with torch.no_grad():
        ours = model(ids, attention_mask=mask, use_cache=False).logits
    model64.set_attn_implementation("eager")
    with torch.no_grad():
        ref = model64(ids, attention_mask=mask, use_cache=False).logits
    torch.testing.assert_close(ours[1:].double(), ref[1:], rtol=1e-4, atol=1e-4)


def test_static_cache_with_a_full_length_mask():
    """A 2-D mask as long as the StaticCache (as a compiled loop pads it) marks its unused tail real; a causal
    layer must still end each row's keys at its last query, as transformers' own masks do."""
    model, _ = build("llama", torch.float64)
    ids = torch.randint(1, 97, (2, 5))
    outs = {}
    for implementation in ("eager", "attn_ops"):
        model.set_attn_implementation(implementation)
        for length in (5, 16):
            cache = transformers.StaticCache(config=model.config, max_cache_len=16)
            with torch.no_grad():
                outs[implementation, length] = model(ids, attention_mask=torch.ones(2, length, dtype=torch.long),
                                                     past_key_values=cache).logits
    for length in (5, 16):
        torch.testing.assert_close(outs["attn_ops", length], outs["eager", 5], rtol=1e-10, atol=1e-10)


def test_chunks_change_the_result():
    """Llama 4's comparisons can fail: attending across its chunks (the layer run as full attention) is caught, in
    a prompt and in generation, where the chunked layer's cache starts past the first token."""
    model, _ = build("llama4", torch.float32)
    ids, mask = prompt("left")
    ours = logits(model, "attn_ops", ids, mask)
    model.config.attention_chunk_size = 64  # one chunk: full attention
    assert (logits(model, "attn_ops", ids, mask) - ours).abs().max() > 1e-2
