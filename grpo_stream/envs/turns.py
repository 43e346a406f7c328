"""How an environment's observation becomes the tokens of its turn.

The trajectory is built by appending token ids: the policy's sampled ids as sampled, then the
environment turn tokenized on its own (`add_special_tokens=False`) — never by decoding and
re-encoding the conversation, which can merge or split tokens differently from what the
policy actually produced (and would drop the end-of-turn tokens it sampled).

- plain (tokenizers without a chat template, the tiny models): the turn is `env.format` with
  `{observation}` replaced, e.g. `higher 9-16:`.
- chat (`task.chat_template`): the turn is what the chat template puts between the end of an
  assistant message and the start of the next assistant message when the observation is the
  next user message (or, `role="tool"`, a tool's answer): the template rendered
  incrementally, as a difference of two renderings of a fixed conversation, so the model
  sees exactly what the template would show it. When the policy's turn stopped without its
  end-of-turn token (truncated), that token is added at the start of the environment turn.
"""

from __future__ import annotations

from typing import Any

_BASE = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]


class TurnFormat:
    """Renders and tokenizes environment turns for one tokenizer."""

    def __init__(
        self, tokenizer: Any, chat: bool, template: str = "{observation}", role: str = "user"
    ) -> None:
        self.tokenizer = tokenizer
        self.chat = chat
        self.template = template
        self._eos_text: str = tokenizer.eos_token or ""
        if chat:
            self._between = _between_turns(tokenizer, role)

    def text(self, observation: str, policy_ended: bool) -> str:
        """The environment turn's text after a policy turn (that ended with EOS or not)."""
        if not self.chat:
            return self.template.replace("{observation}", observation)
        head, tail = self._between
        lead = "" if policy_ended else self._eos_text
        return f"{lead}{head}{observation}{tail}"

    def tokens(self, observation: str, policy_ended: bool) -> list[int]:
        ids: list[int] = self.tokenizer(
            self.text(observation, policy_ended), add_special_tokens=False
        )["input_ids"]
        return ids

    def tokens_many(self, turns: list[tuple[str, bool]]) -> list[list[int]]:
        """`tokens` of each (observation, policy_ended), in one tokenizer call."""
        if not turns:
            return []
        texts = [self.text(observation, ended) for observation, ended in turns]
        ids: list[list[int]] = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        return ids


def _between_turns(tokenizer: Any, role: str) -> tuple[str, str]:
    """(text before, text after) the observation in the chat template, from the end of an
    assistant message's end-of-turn token to the start of the next assistant message, the
    observation being a message of `role` (user, or tool: a tool's answer)."""
    marker = "\x00OBS\x00"
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("task.chat_template = true but the tokenizer has no chat template")
    base = tokenizer.apply_chat_template(_BASE, tokenize=False)
    full = tokenizer.apply_chat_template(
        [*_BASE, {"role": role, "content": marker}], tokenize=False, add_generation_prompt=True
    )
    if not full.startswith(base):
        raise ValueError("the chat template does not render conversations incrementally")
    eos = tokenizer.eos_token or ""
    cut = base.rfind(eos) + len(eos) if eos and eos in base else len(base)
    delta = base[cut:] + full[len(base) :]
    head, _, tail = delta.partition(marker)
    return head, tail
