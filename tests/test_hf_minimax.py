"""attn_ops.integrations.minimax.swap_minimax_attention on a tiny random MiniMaxForCausalLM (no download):
the swapped model shares the parameters and generates the same tokens as the eager model (greedy with left
padding, beam search), in float32 and float64."""

import copy

import pytest
import torch
from transformers import MiniMaxConfig, MiniMaxForCausalLM

from attn_ops.integrations import transformers as hf
from attn_ops.integrations.minimax import MiniMaxLightningAttention, swap_minimax_attention
from reference import assert_close_to_ref

CONFIG = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
              head_dim=8, num_hidden_layers=4, num_local_experts=2, num_experts_per_tok=1, block_size=16,
              pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=256,
              # transformers rotates q / k of the softmax layers before attn_ops sees them; a theta of its own,
              # not the 10000 default, so that rotary tables built elsewhere would not match
              rope_parameters={"rope_type": "default", "rope_theta": 1e6},
              experts_implementation="eager")  # grouped_mm has no float64


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    hf.register()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: a thread pool only adds overhead
    yield
    torch.set_num_threads(threads)


def models(dtype):
    torch.manual_seed(0)
    eager = MiniMaxForCausalLM(MiniMaxConfig(**CONFIG)).eval().to(dtype)
    ours = copy.deepcopy(eager)
    ours.set_attn_implementation("attn_ops")
    assert swap_minimax_attention(ours) == 2
    return eager, ours


def prompt():
    ids = torch.randint(3, CONFIG["vocab_size"], (3, 21))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    mask[2, :1] = 0
    return ids.masked_fill(mask == 0, CONFIG["pad_token_id"]), mask


def test_swap_shares_parameters_and_keeps_state_dict_keys():
    torch.manual_seed(0)
    model = MiniMaxForCausalLM(MiniMaxConfig(**CONFIG)).eval()
    before = {n: p.data_ptr() for n, p in model.named_parameters()}
    keys = set(model.state_dict())
    swap_minimax_attention(model)
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == before
    assert isinstance(model.model.layers[1].self_attn, MiniMaxLightningAttention)
    derived = {k for k in keys if k.rsplit(".", 1)[-1] in ("query_decay", "key_decay", "diagonal_decay")}
    assert set(model.state_dict()) == keys - derived
    model.load_state_dict(MiniMaxForCausalLM(MiniMaxConfig(**CONFIG)).state_dict())  # a MiniMax checkpoint loads


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_greedy_generate_with_left_padding_matches_eager(dtype):
    """The same tokens as the eager model, and every step's logits under the tolerance rule, ref64 being the
    float64 eager model's full forward over the generated tokens (tokens alone let a 30% error in the decay
    pass)."""
    eager, ours = models(dtype)
    ids, mask = prompt()
    new = 10
    kw = dict(attention_mask=mask, max_new_tokens=new, do_sample=False, output_logits=True,
              return_dict_in_generate=True)
    with torch.no_grad():
        expected = eager.generate(ids, **kw)
        got = ours.generate(ids, **kw)
        assert expected.sequences.shape == (3, 21 + new)
        assert torch.equal(got.sequences, expected.sequences)
        eager64 = models(torch.float64)[0]
        full_mask = torch.cat([mask, torch.ones(3, new, dtype=mask.dtype)], 1)
        positions = (full_mask.cumsum(-1) - 1).clamp(min=0)  # generate's: counted over real tokens
        ref64 = eager64(expected.sequences, attention_mask=full_mask, position_ids=positions).logits
    assert_close_to_ref(torch.stack(got.logits, 1), ref64[:, 20:20 + new], torch.stack(expected.logits, 1),
                        name="logits")


def test_beam_search_matches_eager():
    """The same beams and the same beam scores (float64; the beams alone let 30% noise in every lightning
    output pass)."""
    eager, ours = models(torch.float64)
    ids, mask = prompt()
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, num_beams=3, output_scores=True,
              return_dict_in_generate=True)
    with torch.no_grad():
        got, expected = ours.generate(ids, **kw), eager.generate(ids, **kw)
    assert torch.equal(got.sequences, expected.sequences)
    torch.testing.assert_close(got.sequences_scores, expected.sequences_scores, rtol=1e-9, atol=1e-9)


def test_logits_and_training_gradients_match_eager():
    eager, ours = models(torch.float64)
    ids, mask = prompt()
    out_e = eager(ids, attention_mask=mask, labels=ids, use_cache=False)
    out_o = ours(ids, attention_mask=mask, labels=ids, use_cache=False)
    real = mask.bool()
    torch.testing.assert_close(out_o.logits[real], out_e.logits[real], rtol=1e-6, atol=1e-6)
    out_e.loss.backward()
    out_o.loss.backward()
    for (name, pe), (_, po) in zip(eager.named_parameters(), ours.named_parameters()):
        if pe.grad is not None:
            torch.testing.assert_close(po.grad, pe.grad, rtol=1e-5, atol=1e-7, msg=name)
