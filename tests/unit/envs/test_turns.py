"""Environment turns: plain text, or the chat template rendered incrementally."""

from __future__ import annotations

import pytest

from grpo_stream.builds.tiny import build_tokenizer
from grpo_stream.envs.turns import TurnFormat

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def tok():
    tokenizer = build_tokenizer()
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def test_plain_turns_are_the_format_with_the_observation(tok) -> None:
    fmt = TurnFormat(tok, chat=False, template="> {observation}\n")
    assert fmt.text("higher", policy_ended=True) == "> higher\n"
    assert fmt.tokens("hi", True) == tok("> hi\n", add_special_tokens=False)["input_ids"]


def test_chat_turns_continue_the_conversation_exactly_as_the_template_renders_it(tok) -> None:
    """The text after the assistant's <eos>, plus the env turn, is what the template renders
    for the conversation with the observation as the next user message."""
    fmt = TurnFormat(tok, chat=True)
    convo = [{"role": "user", "content": "guess 1-16:"}, {"role": "assistant", "content": "8"}]
    upto_eos = tok.apply_chat_template(convo, tokenize=False).rstrip("\n")
    full = tok.apply_chat_template(
        [*convo, {"role": "user", "content": "higher 9-16:"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert upto_eos + fmt.text("higher 9-16:", policy_ended=True) == full


def test_a_chat_turn_after_a_truncated_reply_closes_it_with_eos(tok) -> None:
    fmt = TurnFormat(tok, chat=True)
    assert fmt.text("x", policy_ended=False) == "<eos>" + fmt.text("x", policy_ended=True)


def test_chat_turns_need_a_chat_template() -> None:
    with pytest.raises(ValueError, match="no chat template"):
        TurnFormat(build_tokenizer(), chat=True)


def test_turns_tokenized_together_are_each_turn_tokenized_alone(tok) -> None:
    fmt = TurnFormat(tok, chat=True)
    turns = [("higher 9-16:", True), ("", False), ("lower 1-7:", True)]
    assert fmt.tokens_many(turns) == [fmt.tokens(o, ended) for o, ended in turns]
    assert fmt.tokens_many([]) == []
