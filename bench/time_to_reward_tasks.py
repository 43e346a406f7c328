"""bench.time_to_reward's tasks: a local JSONL file each (a `question` and an `answer` column,
what a user hands `task.dataset`) and the model that trains on it, all built locally.

- numeric: `a+b=` with a, b in 0..20, the answer a number; the word-level Qwen2 of
  bench/vs_trl_model.py (about 1M parameters; digits, `+` and `=` are its only words), the
  model of issue #46's new-user run.
- choice: multiple choice, `a+b=? options w,x,y,z pick 1-4:` (one option is the sum, three
  are near it, shuffled), the answer the option's number; the shipped tiny model (its
  character-level tokenizer spells the prompt; it answers 1-4 about a fifth of the time
  right before training).
- long: `a+b=`, answered after restating the problem to 64+ characters (`long_answer`); a
  copy of the tiny model with 128 positions, warm-started on such answers (`build_long`)
  until the sum after a correct restatement is right with probability `LONG_TARGET`:
  completions of 64+ tokens.

Each task names the reward a TRL user would write for it: math_verify's parse and verify for
numbers (what TRL's accuracy reward does), the answer's exact text for a choice.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bench.common import TINY_MODEL
from bench.vs_trl_model import build_word, cached_build, with_context

MAX_OPERAND = 20  # the tiny model's and the word model's arith warm start
LONG_MIN = 64
"""A long completion restates the problem until it is at least this many characters (one
token each), then gives the sum: `7+5=7+5=...=7+5=12`."""
LONG_POSITIONS = 128
LONG_TARGET = 0.3
"""The long model's warm start stops when the sum after a correct restatement is sampled
right with this probability (teacher-forced), the tiny model's own target."""
LONG_LR = 1e-3


@dataclass(frozen=True)
class TaskSpec:
    """One task of the bench."""

    name: str
    model: Literal["word", "tiny", "long"]
    max_tokens: int
    """Completion tokens at most, on both sides (ours: generator.max_tokens, set only where
    our default of 8 cannot hold the answer; TRL: max_completion_length)."""
    budget_s: float
    """Wall seconds each run gets, from its launch (TRL's run ends there; ours too)."""
    trl_reward: Literal["math_verify", "exact"]


TASKS = {
    "numeric": TaskSpec("numeric", "word", 8, 150.0, "math_verify"),
    "choice": TaskSpec("choice", "tiny", 8, 150.0, "exact"),
    "long": TaskSpec("long", "long", 96, 300.0, "math_verify"),
}


def problem(task: str, rng: random.Random) -> tuple[str, str]:
    """One (question, answer) row of `task`."""
    a, b = rng.randint(0, MAX_OPERAND), rng.randint(0, MAX_OPERAND)
    if task != "choice":
        return f"{a}+{b}=", str(a + b)
    s = a + b
    options = [s, *rng.sample([x for x in range(max(0, s - 5), s + 6) if x != s], 3)]
    rng.shuffle(options)
    listed = ",".join(str(o) for o in options)
    return f"{a}+{b}=? options {listed} pick 1-4:", str(options.index(s) + 1)


def write_dataset(task: str, path: Path, seed: int, rows: int = 4000) -> Path:
    """`rows` problems of `task` as JSONL (`question`, `answer`), drawn with `seed`."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for _ in range(rows):
            question, answer = problem(task, rng)
            out.write(json.dumps({"question": question, "answer": answer}) + "\n")
    return path


def task_model(spec: TaskSpec, keep: Path, seed: int) -> str:
    """The model `spec` trains: built once into `keep` (reused while its build.json asks
    for the same build)."""
    if spec.model == "tiny":
        return TINY_MODEL
    if spec.model == "word":
        out = keep / "word"
        cached_build(out, {"seed": seed, "sft_cap": 200}, lambda d: build_word(d, seed, 200))
        return str(out)
    out = keep / "long"
    cached_build(out, {"seed": seed, "target": LONG_TARGET}, lambda d: build_long(d, seed))
    return str(out)


def long_answer(a: int, b: int) -> str:
    """`a+b=` restated until the text is LONG_MIN characters long, then the sum."""
    problem = f"{a}+{b}="
    return problem * -(-LONG_MIN // len(problem)) + str(a + b)


def long_rows(tokenizer: Any, pairs: list[tuple[int, int]]) -> list[tuple[list[int], list[int]]]:
    """(token ids, labels) of `a+b=` and its long answer: labels on the completion only."""
    rows = []
    for a, b in pairs:
        prompt = tokenizer(f"{a}+{b}=")["input_ids"]
        text = long_answer(a, b)
        completion = [*tokenizer(text, add_special_tokens=False)["input_ids"]]
        completion.append(tokenizer.eos_token_id)
        rows.append(([*prompt, *completion], [-100] * len(prompt) + completion))
    return rows


def answer_probability(model: Any, tokenizer: Any, pairs: list[tuple[int, int]]) -> float:
    """Mean probability of the sum's tokens and <eos> after the correct restatement (teacher
    forced): what sampling the answer converges to once the restatement is right."""
    import torch

    from grpo_stream.builds.sft import pad_rows

    rows = long_rows(tokenizer, pairs)
    answers = [
        len(tokenizer(str(a + b), add_special_tokens=False)["input_ids"]) + 1 for a, b in pairs
    ]
    answer_rows = [
        (ids, [-100] * (len(lab) - n) + lab[-n:])
        for (ids, lab), n in zip(rows, answers, strict=True)
    ]
    ids, mask, labels = pad_rows(answer_rows, tokenizer.pad_token_id)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()  # (B, T-1, V)
    model.train()
    target = labels[:, 1:]  # (B, T-1)
    logp = torch.log_softmax(logits, -1).gather(-1, target.clamp(min=0).unsqueeze(-1))[..., 0]
    return float((logp * (target != -100)).sum(-1).exp().mean())


def build_long(out: Path, seed: int, max_steps: int = 2000) -> dict[str, Any]:
    """The long task's model: the tiny model with LONG_POSITIONS positions, warm-started on
    `long_answer` texts until `answer_probability` reaches LONG_TARGET; saved to `out`."""
    import torch

    from grpo_stream.builds import sft
    from grpo_stream.builds.sft import WarmStart, pad_rows
    from grpo_stream.models.loading import load_policy, load_tokenizer

    longer = with_context(TINY_MODEL, out.parent / "long-context", LONG_POSITIONS)
    tokenizer = load_tokenizer(longer)
    tokenizer.model_max_length = LONG_POSITIONS
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # deterministic for a thread count; one: quick on a busy host
    torch.manual_seed(seed)
    model = load_policy(longer, dtype="float32", trainable=True)
    pairs = [(a, b) for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)]
    plan = WarmStart(
        batches=lambda rng: pad_rows(
            long_rows(tokenizer, [rng.choice(pairs) for _ in range(32)]), tokenizer.pad_token_id
        ),
        score=lambda m: answer_probability(m, tokenizer, pairs),
        target=LONG_TARGET,
        max_steps=max_steps,
        eval_every=25,
        label="answer_prob",
        lr=LONG_LR,
    )
    steps, score = sft.warm_start(model, plan, seed)
    torch.set_num_threads(threads)
    sft.save(model, tokenizer, out)
    return {
        "path": str(out),
        "sft_steps": steps,
        "answer_probability": round(score, 4),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
