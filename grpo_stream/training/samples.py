"""Sample completions during a run (`run.log_completions`): every N steps the completions of
the first `run.log_completions_prompts` prompts of the batch just trained, decoded, go to
RUN_DIR/completions.jsonl (one JSON object per completion), the console (one
`trainer.samples` event) and the TensorBoard sink (as text).

What is shown is exactly what was trained: the sequences of the TrainBatch, their rewards
and advantages, decoded with the trainer's tokenizer (special tokens kept, so an
end-of-sequence token is visible). A batch's sequences are in group order; the completions of
one prompt are its consecutive sequences with the same prompt tokens.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from grpo_stream.jsonl import read_rows
from grpo_stream.protocols.messages import TrainBatch
from grpo_stream.training.sinks import Sink

FILE = "completions.jsonl"


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


@dataclass(frozen=True)
class Sample:
    """One trained completion as a user reads it."""

    step: int
    prompt: str
    completion: str
    reward: float
    advantage: float
    version: int
    tokens: int


def batch_samples(batch: TrainBatch, tokenizer: Decoder, step: int, prompts: int) -> list[Sample]:
    """The completions of the first `prompts` prompts of `batch`, decoded."""
    ids = np.asarray(batch.input_ids)
    offsets = np.asarray(batch.seq_offsets)
    out: list[Sample] = []
    seen = 0
    previous: tuple[int, ...] | None = None
    for s in range(len(offsets) - 1):
        lo, hi = int(offsets[s]), int(offsets[s + 1])
        cut = lo + int(batch.prompt_lens[s])
        prompt_ids = tuple(int(t) for t in ids[lo:cut])
        if prompt_ids != previous:
            seen += 1
            if seen > prompts:
                break
            previous = prompt_ids
            prompt = tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        completion = [int(t) for t in ids[cut:hi]]
        out.append(
            Sample(
                step=step,
                prompt=prompt,
                completion=tokenizer.decode(completion, skip_special_tokens=False),
                reward=float(batch.rewards[s]),
                advantage=float(batch.advantages[s]),
                version=int(batch.versions[s]),
                tokens=len(completion),
            )
        )
    return out


def render(samples: list[Sample]) -> str:
    """Markdown for a text sink: per prompt, its completions with reward and advantage."""
    lines: list[str] = []
    prompt = None
    for s in samples:
        if s.prompt != prompt:
            prompt = s.prompt
            lines.append(f"**prompt** `{prompt}`\n")
        lines.append(f"- reward {s.reward:.3f}, advantage {s.advantage:+.3f}: `{s.completion}`")
    return "\n".join(lines)


class CompletionLog:
    """Appends samples to RUN_DIR/completions.jsonl and hands them to text sinks."""

    def __init__(self, run_dir: Path, every: int, prompts: int) -> None:
        self.path = Path(run_dir) / FILE
        self.every = every
        self.prompts = prompts

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def write(self, samples: list[Sample], sinks: list[Sink]) -> None:
        with self.path.open("a") as f:
            for s in samples:
                f.write(json.dumps(asdict(s)) + "\n")
        if samples:
            text = render(samples)
            for sink in sinks:
                sink.write_text(samples[0].step, "completions", text)


def read_samples(run_dir: Path) -> list[dict[str, Any]]:
    """Every sample logged in a run directory (none when the file is absent).

    Safe on a live run (`grpo_stream.jsonl`): a last line the trainer is still writing is
    not read, and a line that does not parse (a trainer killed mid-line, then resumed) is
    skipped, so the rows read are always whole samples in file order."""
    return read_rows(Path(run_dir) / FILE)
