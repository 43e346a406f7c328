"""Offline evaluation: pass@1, pass@K and mean reward of a model on a task.

For each of N problems (task indices 0..N-1; of the held-out part when task.holdout > 0, the
problems evaluation during training sees) the model samples K completions with
transformers `generate` (batched, left-padded, pure temperature sampling: top_k = 0,
top_p = 1); each completion is scored in-process with the task's rewards.

Invariants: a sample is correct when the first reward (the task's verifier) scores at least
1.0; pass@k uses the unbiased estimator 1 - C(n-c, k) / C(n, k) of Chen et al. (2021),
computed as a product so that it never overflows; a reward that raises (or returns NaN or
inf) scores 0.0 for that component and is counted in `reward_errors`, never silently dropped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import structlog

from grpo_stream.config.tasks import RewardSpec, TaskSettings
from grpo_stream.models.loading import Dtype, load_policy, load_tokenizer
from grpo_stream.rewards import RewardFn, combine, load_reward, reward_specs
from grpo_stream.tasks import Problem, make_eval_task, make_task

log = structlog.get_logger()

GREEDY_TOP_P = 1e-9
"""Greedy decoding through the engines' sampler: a nucleus this small keeps only the most
likely token (the nucleus always keeps one)."""

Progress = Callable[[int, int], None]
"""Called with (problems done, problems in all) after each generation batch."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0  # every k-subset holds a correct sample
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@dataclass(frozen=True)
class Sample:
    """One completion and what generation says about it."""

    text: str
    truncated: bool
    """It hit max_tokens without an end-of-sequence token."""


@dataclass
class EvalResult:
    """What `grpo-stream eval` prints."""

    model: str
    task: str
    problems: int
    samples: int
    pass_at_1: float
    pass_at_k: float
    mean_reward: float
    reward_means: dict[str, float]
    reward_errors: int
    truncated: int
    max_tokens: int
    temperature: float
    examples: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    samples: int,
    max_tokens: int,
    temperature: float,
) -> list[list[Sample]]:
    """`samples` completions for each prompt, sampled in one batched `generate` call."""
    import torch

    batch = tokenizer(list(prompts), return_tensors="pt", padding=True).to(model.device)
    with torch.no_grad():
        out = model.generate(
            **batch,
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_tokens,
            num_return_sequences=samples,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    new = out[:, batch["input_ids"].shape[1] :].tolist()  # (B * samples, <= max_tokens)
    result: list[list[Sample]] = []
    for i in range(len(prompts)):
        group = []
        for row in new[i * samples : (i + 1) * samples]:
            ended = tokenizer.eos_token_id in row
            tokens = row[: row.index(tokenizer.eos_token_id)] if ended else row
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            group.append(Sample(text=text, truncated=not ended))
        result.append(group)
    return result


@dataclass
class Tally:
    """Running sums over scored samples."""

    specs: list[RewardSpec]
    correct: list[int] = field(default_factory=list)
    totals: list[float] = field(default_factory=list)
    sums: list[float] = field(default_factory=list)
    errors: int = 0
    truncated: int = 0

    def __post_init__(self) -> None:
        self.sums = [0.0] * len(self.specs)

    def summary(self, k: int) -> dict[str, Any]:
        """pass@1, pass@k, mean rewards and counts, as EvalResult fields."""
        n = len(self.totals)
        return {
            "pass_at_1": math.fsum(pass_at_k(k, c, 1) for c in self.correct) / len(self.correct),
            "pass_at_k": math.fsum(pass_at_k(k, c, k) for c in self.correct) / len(self.correct),
            "mean_reward": math.fsum(self.totals) / n,
            "reward_means": {s.name: v / n for s, v in zip(self.specs, self.sums, strict=True)},
            "reward_errors": self.errors,
            "truncated": self.truncated,
        }


def score_group(fns: list[RewardFn], tally: Tally, problem: Problem, group: list[Sample]) -> None:
    """Score one problem's samples with every reward and add them to `tally`."""
    hits = 0
    for sample in group:
        values = []
        for spec, fn in zip(tally.specs, fns, strict=True):
            try:
                value = float(fn(sample.text, prompt=problem.prompt, reference=problem.reference))
            except Exception as exc:  # any failure of a reward scores 0 and is counted
                log.debug("eval.reward_error", reward=spec.name, error=repr(exc)[:200])
                value = math.nan
            if not math.isfinite(value):
                tally.errors += 1
                value = 0.0
            values.append(value)
        hits += values[0] >= 1.0
        tally.truncated += sample.truncated
        tally.totals.append(combine(values, tally.specs))
        tally.sums = [s + v for s, v in zip(tally.sums, values, strict=True)]
    tally.correct.append(hits)


def evaluate(
    model_name: str,
    task_settings: TaskSettings,
    *,
    samples: int = 8,
    problems: int = 64,
    max_tokens: int = 8,
    temperature: float = 1.0,
    seed: int = 0,
    device: str = "cpu",
    dtype: Dtype = "auto",
    batch_size: int = 256,
    progress: Progress | None = None,
) -> EvalResult:
    """Sample `samples` completions for each of `problems` problems and score them."""
    import torch

    if samples < 1 or problems < 1 or batch_size < 1:
        raise ValueError("samples, problems and batch_size must be >= 1")
    tokenizer = load_tokenizer(model_name)
    model = load_policy(model_name, dtype=dtype, device=device, trainable=False)
    held_out = task_settings.holdout > 0
    task = (make_eval_task if held_out else make_task)(task_settings, tokenizer=tokenizer)
    specs = reward_specs(task_settings, task)
    fns = [load_reward(spec) for spec in specs]
    torch.manual_seed(seed)
    tally = Tally(specs=specs)
    examples: list[dict[str, Any]] = []
    per_batch = max(1, batch_size // samples)
    for start in range(0, problems, per_batch):
        batch = [task.problem(i) for i in range(start, min(problems, start + per_batch))]
        prompts = [p.prompt for p in batch]
        groups = generate(model, tokenizer, prompts, samples, max_tokens, temperature)
        for problem, group in zip(batch, groups, strict=True):
            score_group(fns, tally, problem, group)
            if len(examples) < 3:
                examples.append({"prompt": problem.prompt, "completion": group[0].text})
        if progress is not None:
            progress(start + len(batch), problems)
    result = EvalResult(
        model=model_name,
        task=task_settings.name,
        problems=problems,
        samples=samples,
        max_tokens=max_tokens,
        temperature=temperature,
        examples=examples,
        **tally.summary(samples),
    )
    log.info("eval.done", **{k: v for k, v in result.to_dict().items() if k != "examples"})
    return result
