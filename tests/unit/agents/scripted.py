"""An engine stand-in for the endpoint's bookkeeping tests: each row's reply is chosen by a
script from the row's text (the tokenizer is real, the model is not; the tests of real
sampling and token exactness use the hf engine)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grpo_stream.sampling import Completion, Sampling

END = "<eos>"


@dataclass
class Scripted:
    """`script(row_text) -> reply text`; a reply ending in <eos> ends its turn."""

    tokenizer: Any
    script: Callable[[str], str]
    calls: list[list[list[int]]] = field(default_factory=list)

    def complete(self, rows: list[list[int]], sampling: Sampling) -> list[Completion]:
        self.calls.append([list(r) for r in rows])
        max_tokens = sampling.max_tokens
        out = []
        for row in rows:
            text = self.script(self.tokenizer.decode(row))
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            cut = ids[:max_tokens]
            ended = bool(cut) and cut[-1] == self.tokenizer.eos_token_id
            lps = [-0.01 * (i + 1) for i in range(len(cut))]
            out.append(Completion(cut, lps, self.tokenizer.decode(cut, skip_special_tokens=True),
                                  truncated=not ended and len(cut) == max_tokens))  # fmt: skip
        return out
