"""judge: a generative reward model. A local causal LM reads a rubric with the prompt and the
completion filled in, writes its verdict, and a regular expression reads the score from it.

    [[task.rewards]]
    name = "judge"
    path = "grpo-stream/tiny-judge"        # any causal LM: a local path or a Hugging Face name
    params = { template = "{prompt}{completion}|{answer}\\nscore:", pattern = "([01])" }

`template` has `{prompt}`, `{completion}` and each field of the task's reference (`{answer}`)
replaced by their values (other braces stay as they are); with `chat = true` the filled
template is the user turn of the judge's chat template. The judge decodes greedily up to
`max_tokens` tokens; the reward is the first match of `pattern` in its output (the first
group, or the whole match) divided by `max_score`.

Where it runs: in the scorer's reward workers, like every reward (`grpo_stream.rewards.sandbox`):
loaded once per worker, a group's completions judged in batches of `batch_size` on the judge's
own engine (hf generate on `device`), bounded by scorer.timeout_s per chunk. It never blocks
generation: scorers pull groups with credits while generators keep sampling; a slow judge
scales out with scorer.count (more scorer processes) or scorer.workers.

Invariants: an output without a score (the pattern finds nothing, or no number) is `Unparsed`:
the sandbox makes it a NaN reward, counted under the failure kind "unparseable" with the
judge's words in the error line, never a crash; a verdict is cached by the filled prompt (LRU
of `cache_size`), so a completion seen before (a repeated prompt, a replayed group) is not
judged twice by the same worker.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from grpo_stream.models.loading import load_policy, load_tokenizer, resolve_device
from grpo_stream.rewards.errors import RewardLoadError

DEFAULT_TEMPLATE = "{prompt}{completion}|{answer}\nscore:"
"""The tiny judge's rubric: the problem, the answer, the reference answer, then its one-digit
verdict (a reference-guided judge: it compares, it does not solve)."""
DEFAULT_PATTERN = r"-?\d+(?:\.\d+)?"
"""The first number in the judge's output."""
_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class Unparsed:
    """A judge's output with no score in it (the sandbox scores it NaN, kind "unparseable")."""

    text: str


def fill(template: str, prompt: str, completion: str, reference: dict[str, Any]) -> str:
    """`template` with {prompt}, {completion} and each reference field replaced; other braces
    (and names that are none of these) stay as they are."""
    values = {**{k: str(v) for k, v in reference.items()}, "prompt": prompt}
    values["completion"] = completion

    def sub(match: re.Match[str]) -> str:
        return values.get(match.group(1), match.group(0))

    return _FIELD.sub(sub, template)


def parse(text: str, pattern: re.Pattern[str], max_score: float) -> float | Unparsed:
    """The score in `text`: the first match's first group (or the whole match) / max_score."""
    found = pattern.search(text)
    if found is None:
        return Unparsed(text)
    raw = found.group(1) if pattern.groups else found.group(0)
    try:
        return float(raw) / max_score
    except ValueError:
        return Unparsed(text)


@dataclass
class Judge:
    """A loaded judge, callable like any reward; `score_batch` judges a chunk at once."""

    model: Any
    tokenizer: Any
    device: str
    template: str
    pattern: re.Pattern[str]
    max_score: float
    max_tokens: int
    batch_size: int
    chat: bool
    cache_size: int
    cache: OrderedDict[str, float | Unparsed] = field(default_factory=OrderedDict)
    hits: int = 0
    judged: int = 0

    @classmethod
    def load(
        cls,
        path: str,
        template: str = DEFAULT_TEMPLATE,
        pattern: str = DEFAULT_PATTERN,
        max_score: float = 1.0,
        max_tokens: int = 4,
        batch_size: int = 16,
        device: str = "auto",
        chat: bool = False,
        cache_size: int = 4096,
    ) -> Judge:
        if max_tokens < 1 or batch_size < 1 or cache_size < 0 or max_score == 0:
            raise RewardLoadError(
                f"judge {path}: max_tokens and batch_size must be >= 1, cache_size >= 0, "
                "max_score non-zero"
            )
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise RewardLoadError(f"judge {path}: pattern {pattern!r}: {exc}") from None
        dev = resolve_device(None if device == "auto" else device)
        try:
            model = load_policy(path, device=dev, trainable=False)
            tokenizer = load_tokenizer(path)
        except (OSError, ValueError) as exc:
            raise RewardLoadError(f"judge {path}: cannot load it: {exc}") from None
        if chat and getattr(tokenizer, "chat_template", None) is None:
            raise RewardLoadError(f"judge {path}: chat = true but it has no chat template")
        return cls(model, tokenizer, dev, template, regex, float(max_score), max_tokens,
                   batch_size, chat, cache_size)  # fmt: skip

    def __call__(
        self, completion: str, *, prompt: str, reference: dict[str, Any]
    ) -> float | Unparsed:
        return self.score_batch([completion], prompt=prompt, reference=reference)[0]

    def score_batch(
        self, completions: list[str], *, prompt: str, reference: dict[str, Any]
    ) -> list[float | Unparsed]:
        """Each completion's score (or Unparsed), judging only those not in the cache."""
        asks = [self._render(fill(self.template, prompt, c, reference)) for c in completions]
        verdicts: dict[str, float | Unparsed] = {}
        for ask in asks:
            if ask in self.cache:
                verdicts[ask] = self.cache[ask]
                self.cache.move_to_end(ask)
        todo = [a for a in dict.fromkeys(asks) if a not in verdicts]
        self.hits += len(asks) - len(todo)
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start : start + self.batch_size]
            for ask, text in zip(chunk, self._generate(chunk), strict=True):
                verdicts[ask] = parse(text, self.pattern, self.max_score)
                self._remember(ask, verdicts[ask])
        self.judged += len(todo)
        return [verdicts[a] for a in asks]

    def _remember(self, ask: str, verdict: float | Unparsed) -> None:
        if self.cache_size == 0:
            return
        self.cache[ask] = verdict
        self.cache.move_to_end(ask)
        while len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)

    def _render(self, text: str) -> str:
        if not self.chat:
            return text
        rendered: str = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        return rendered

    def _generate(self, asks: list[str]) -> list[str]:
        """The judge's greedy continuation of each filled prompt (left-padded batch)."""
        import torch

        batch = self.tokenizer(asks, return_tensors="pt", padding=True).to(self.device)
        with torch.inference_mode():
            out = self.model.generate(
                **batch,
                do_sample=False,
                max_new_tokens=self.max_tokens,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        new = out[:, batch["input_ids"].shape[1] :]
        return [str(t) for t in self.tokenizer.batch_decode(new, skip_special_tokens=True)]
