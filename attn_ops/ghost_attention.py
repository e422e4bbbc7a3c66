"""Ghost Attention (GAtt, Llama 2) fine-tuning data helpers.

Ghost Attention is a data technique, not an operator: the model keeps following an
instruction given once at the start of a dialogue because it is trained on dialogues where the
instruction appears only in the first user turn while every assistant answer was sampled with the
instruction attached to every user turn. See docs/ghost_attention.md.

* :func:`ghost_attention_sampling_messages`: the messages to sample the synthetic answers with
  (instruction attached to every user turn).
* :func:`ghost_attention_sample`: one training sample (``input_ids``, ``labels``, ``attention_mask``)
  with the instruction kept only in the first user turn and the loss only on the trained assistant
  turns.
"""
from typing import Dict, List, Mapping, Sequence

import torch

__all__ = ["IGNORE_INDEX", "ghost_attention_sample", "ghost_attention_sampling_messages"]

IGNORE_INDEX = -100  # label value that torch.nn.functional.cross_entropy (and HF models) skip

_TRAIN_TURNS = ("last", "all")


def _check_dialogue(dialogue: Sequence[Mapping[str, str]]) -> None:
    """A dialogue is an optional system message, then user/assistant turns alternating, starting with
    a user turn."""
    if not isinstance(dialogue, (list, tuple)) or len(dialogue) == 0:
        raise ValueError(
            f"ghost_attention: dialogue expected a non-empty list of messages, got {type(dialogue).__name__} "
            f"of length {len(dialogue) if hasattr(dialogue, '__len__') else 'unknown'}")
    start = 1 if isinstance(dialogue[0], Mapping) and dialogue[0].get("role") == "system" else 0
    for i, message in enumerate(dialogue):
        if not isinstance(message, Mapping) or not isinstance(message.get("content"), str):
            raise ValueError(
                f"ghost_attention: dialogue[{i}] expected a dict with a str 'content', got {message!r}")
        if i < start:
            continue
        expected = "user" if (i - start) % 2 == 0 else "assistant"
        if message.get("role") != expected:
            raise ValueError(
                f"ghost_attention: dialogue[{i}] role expected '{expected}' (an optional system message, "
                f"then user/assistant turns alternating), got {message.get('role')!r}")


def _with_instruction(message: Mapping[str, str], instruction: str, separator: str) -> Dict[str, str]:
    return {**message, "content": f"{instruction}{separator}{message['content']}"}


def ghost_attention_sampling_messages(
    dialogue: Sequence[Mapping[str, str]], instruction: str, *, separator: str = "\n"
) -> List[Dict[str, str]]:
    """The dialogue with ``instruction`` attached to every user turn: what the model that samples the
    synthetic assistant answers is prompted with (one turn at a time, in a sampling loop)."""
    _check_dialogue(dialogue)
    return [_with_instruction(m, instruction, separator) if m["role"] == "user" else dict(m) for m in dialogue]


def _token_ids(tokenizer, messages, add_generation_prompt: bool) -> List[int]:
    # Render the text with the chat template, then tokenize it without adding special tokens a second
    # time (the template writes them); this works the same across transformers versions.
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def ghost_attention_sample(
    dialogue: Sequence[Mapping[str, str]],
    instruction: str,
    tokenizer,
    *,
    train_turns: str = "last",
    separator: str = "\n",
) -> Dict[str, torch.Tensor]:
    """Build one Ghost Attention training sample through ``tokenizer``'s chat template.

    Args:
        dialogue: messages ``{"role": ..., "content": ...}``: an optional ``system`` message, then
            ``user`` / ``assistant`` turns alternating, ending with an ``assistant`` turn. The assistant
            answers are the ones sampled with the instruction attached to every user turn (see
            :func:`ghost_attention_sampling_messages`); the user turns are given without it.
        instruction: the instruction that must hold for the whole dialogue. It is attached (followed
            by ``separator``) to the first user turn only.
        tokenizer: a transformers tokenizer with a ``chat_template``.
        train_turns: ``"last"`` (the paper: the loss of every earlier turn, assistant answers
            included, is zero) or ``"all"`` (every assistant turn is trained).
        separator: put between the instruction and the first user message.

    Returns:
        ``{"input_ids", "labels", "attention_mask"}``, 1-D int64 tensors of the same length.
        ``labels`` equals ``input_ids`` on the tokens of the trained assistant turns (from the first
        token after the template's generation prompt to the end of the turn, its end-of-turn tokens
        included) and ``-100`` everywhere else. Labels are not shifted (HF models shift them).

    Raises:
        ValueError: on a malformed dialogue, a dialogue that does not end with an assistant turn, an
            unknown ``train_turns``, or a chat template whose rendering of a dialogue prefix is not a
            token prefix of the whole dialogue (then the assistant spans cannot be located).
    """
    if train_turns not in _TRAIN_TURNS:
        raise ValueError(f"ghost_attention: train_turns expected one of {_TRAIN_TURNS}, got {train_turns!r}")
    _check_dialogue(dialogue)
    if dialogue[-1]["role"] != "assistant":
        raise ValueError(
            f"ghost_attention: dialogue expected to end with an assistant turn (the answer to train), "
            f"got a last role {dialogue[-1]['role']!r}")
    first_user = next(i for i, m in enumerate(dialogue) if m["role"] == "user")
    messages = [_with_instruction(m, instruction, separator) if i == first_user else dict(m)
                for i, m in enumerate(dialogue)]

    input_ids = _token_ids(tokenizer, messages, add_generation_prompt=False)
    labels = [IGNORE_INDEX] * len(input_ids)
    assistant_turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    trained = assistant_turns[-1:] if train_turns == "last" else assistant_turns
    for i in trained:
        # The turn's tokens are what the whole dialogue adds after the prompt that asks for turn i.
        prompt = _token_ids(tokenizer, messages[:i], add_generation_prompt=True)
        through = _token_ids(tokenizer, messages[: i + 1], add_generation_prompt=False)
        if input_ids[: len(prompt)] != prompt or input_ids[: len(through)] != through:
            raise ValueError(
                f"ghost_attention: tokenizer chat template expected to render dialogue[:{i}] as a token "
                f"prefix of the whole dialogue, got a different tokenization; the assistant turn cannot "
                f"be located")
        labels[len(prompt): len(through)] = input_ids[len(prompt): len(through)]
    ids = torch.tensor(input_ids, dtype=torch.long)
    return {
        "input_ids": ids,
        "labels": torch.tensor(labels, dtype=torch.long),
        "attention_mask": torch.ones_like(ids),
    }
