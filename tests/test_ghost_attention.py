"""attn_ops.ghost_attention.ghost_attention_sample: a tokenizer built here from a small word-level vocabulary
(no download), with a chat template that marks each turn; expected tokens written out by hand."""
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from attn_ops.ghost_attention import IGNORE_INDEX, ghost_attention_sample, ghost_attention_sampling_messages

WORDS = ("<pad> <unk> <s> </s> <|system|> <|user|> <|assistant|> <|end|> be brief speak french "
         "hello hi how are you fine thanks bye bonjour salut merci").split()
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|> {% endif %}")


@pytest.fixture(scope="module")
def tokenizer():
    vocab = {w: i for i, w in enumerate(WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>",
                                  bos_token="<s>", eos_token="</s>")
    tok.chat_template = TEMPLATE
    return tok


def ids(tokenizer, text):
    return tokenizer.convert_tokens_to_ids(text.split())


DIALOGUE = [
    {"role": "user", "content": "hello"},
    {"role": "assistant", "content": "bonjour"},
    {"role": "user", "content": "how are you"},
    {"role": "assistant", "content": "merci"},
    {"role": "user", "content": "bye"},
    {"role": "assistant", "content": "salut"},
]


def test_instruction_only_in_first_turn_and_loss_on_last_answer(tokenizer):
    sample = ghost_attention_sample(DIALOGUE, "speak french", tokenizer, separator=" ")
    expected = ids(tokenizer, "<s> <|user|> speak french hello <|end|> <|assistant|> bonjour <|end|> "
                              "<|user|> how are you <|end|> <|assistant|> merci <|end|> "
                              "<|user|> bye <|end|> <|assistant|> salut <|end|>")
    assert sample["input_ids"].tolist() == expected
    trained = ids(tokenizer, "salut <|end|>")
    assert sample["labels"].tolist() == [IGNORE_INDEX] * (len(expected) - 2) + trained
    assert sample["attention_mask"].tolist() == [1] * len(expected)
    assert all(t.dtype == torch.long for t in sample.values())


def test_train_all_assistant_turns(tokenizer):
    sample = ghost_attention_sample(DIALOGUE, "speak french", tokenizer, train_turns="all")
    tokens = tokenizer.convert_ids_to_tokens(sample["input_ids"].tolist())
    kept = [t for t, label in zip(tokens, sample["labels"].tolist()) if label != IGNORE_INDEX]
    assert kept == "bonjour <|end|> merci <|end|> salut <|end|>".split()
    for label, token in zip(sample["labels"].tolist(), sample["input_ids"].tolist()):
        assert label in (IGNORE_INDEX, token)


def test_system_message_and_unknown_words(tokenizer):
    dialogue = [{"role": "system", "content": "be brief"}] + DIALOGUE[:2]
    sample = ghost_attention_sample(dialogue, "speak french", tokenizer, separator=" ")
    tokens = tokenizer.convert_ids_to_tokens(sample["input_ids"].tolist())
    assert tokens == ("<s> <|system|> be brief <|end|> <|user|> speak french hello <|end|> "
                      "<|assistant|> bonjour <|end|>").split()
    assert (sample["labels"] != IGNORE_INDEX).sum() == 2


def test_sampling_messages_attach_instruction_to_every_user_turn():
    messages = ghost_attention_sampling_messages(DIALOGUE, "speak french")
    assert [m["content"] for m in messages] == [
        "speak french\nhello", "bonjour", "speak french\nhow are you", "merci", "speak french\nbye", "salut"]
    assert DIALOGUE[0]["content"] == "hello"  # the input is not modified


def test_loss_masking_with_cross_entropy(tokenizer):
    """The labels plug into the usual shifted cross entropy: only the trained tokens contribute."""
    sample = ghost_attention_sample(DIALOGUE, "speak french", tokenizer)
    logits = torch.randn(len(sample["input_ids"]), len(WORDS), dtype=torch.float64)
    loss = torch.nn.functional.cross_entropy(logits[:-1], sample["labels"][1:])
    keep = sample["labels"][1:] != IGNORE_INDEX
    manual = -torch.log_softmax(logits[:-1][keep], -1).gather(1, sample["labels"][1:][keep, None]).mean()
    torch.testing.assert_close(loss, manual)


@pytest.mark.parametrize("dialogue, kwargs, message", [
    ([], {}, "ghost_attention: dialogue expected a non-empty list of messages, got list of length 0"),
    ([{"role": "user"}], {}, "ghost_attention: dialogue[0] expected a dict with a str 'content', got {'role': 'user'}"),
    ([{"role": "assistant", "content": "hi"}], {},
     "ghost_attention: dialogue[0] role expected 'user' (an optional system message, then user/assistant turns "
     "alternating), got 'assistant'"),
    (DIALOGUE[:1], {}, "ghost_attention: dialogue expected to end with an assistant turn (the answer to train), "
                       "got a last role 'user'"),
    (DIALOGUE, {"train_turns": "first"},
     "ghost_attention: train_turns expected one of ('last', 'all'), got 'first'"),
])
def test_bad_inputs(tokenizer, dialogue, kwargs, message):
    with pytest.raises(ValueError) as info:
        ghost_attention_sample(dialogue, "speak french", tokenizer, **kwargs)
    assert str(info.value) == message


def test_template_that_is_not_prefix_stable(tokenizer):
    """A template that renders the last turn differently cannot be aligned: a clear error, not wrong labels."""
    tok = tokenizer.__class__(tokenizer_object=tokenizer.backend_tokenizer, unk_token="<unk>", bos_token="<s>")
    tok.chat_template = ("{% for m in messages %}{% if loop.last %}<|end|> {% endif %}<|{{ m['role'] }}|> "
                         "{{ m['content'] }} {% endfor %}")
    with pytest.raises(ValueError) as info:
        ghost_attention_sample(DIALOGUE[:2], "speak french", tok)
    assert str(info.value) == (
        "ghost_attention: tokenizer chat template expected to render dialogue[:1] as a token prefix of the whole "
        "dialogue, got a different tokenization; the assistant turn cannot be located")
