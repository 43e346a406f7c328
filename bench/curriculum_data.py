"""bench.curriculum's dataset: candidates probed by the shipped tiny model, split by level into
a training and a held-out file; and the sampler that scores problems and checkpoints."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import TINY_MODEL

LEVELS = ("easy", "medium", "hard")


class Scorer:
    """The tiny model on the hf engine, its weights swapped in from checkpoints, scored by
    exact match: the probe's and the evaluation's one sampler."""

    def __init__(self, temperature: float) -> None:
        import torch

        from grpo_stream.config.tasks import RewardSpec
        from grpo_stream.engines.hf import HFEngine
        from grpo_stream.models.loading import load_policy, load_tokenizer
        from grpo_stream.rewards import load_reward

        torch.set_num_threads(1)
        policy = load_policy(TINY_MODEL, dtype="float32", device="cpu", trainable=False)
        self.engine = HFEngine(policy, load_tokenizer(TINY_MODEL), "cpu")
        self.base = {k: v.clone() for k, v in policy.named_parameters()}
        self.exact = load_reward(RewardSpec(name="exact_match"))
        self.temperature = temperature

    def load(self, checkpoint: Path | None, version: int) -> None:
        """The weights of a trainer checkpoint (None: the shipped model's)."""
        from grpo_stream.models.loading import load_policy

        if checkpoint is None:
            self.engine.load_weights(self.base.items(), version)
            return
        policy = load_policy(str(checkpoint), dtype="float32", device="cpu", trainable=False)
        self.engine.load_weights(policy.named_parameters(), version)

    def pass_rates(self, rows: list[dict[str, Any]], samples: int, seed: int) -> list[float]:
        """Each row's share of `samples` completions that match its answer."""
        from grpo_stream.sampling import Sampling

        out: list[float] = []
        for start in range(0, len(rows), 100):
            part = rows[start : start + 100]
            prompts = [r["question"] for r in part]
            sampling = Sampling(8, self.temperature, seed=seed + start)
            groups = self.engine.generate(prompts, samples, sampling)
            for row, group in zip(part, groups, strict=True):
                ref = {"answer": row["answer"]}
                texts = [c.text for c in group.completions]
                out.append(float(np.mean([self.exact(t, prompt="", reference=ref) for t in texts])))
        return out


def probe(args: argparse.Namespace, scorer: Scorer) -> list[dict[str, Any]]:
    """Every candidate with the shipped model's pass rate on it."""
    pairs = [(a, b) for a in range(args.operands) for b in range(args.operands)]
    rows = [{"question": f"{a}+{b}=", "answer": str(a + b)} for a, b in pairs]
    for row, rate in zip(rows, scorer.pass_rates(rows, args.probe_samples, 0), strict=True):
        row["pass_rate"] = rate
    return rows


def level(rate: float, easy: float) -> str | None:
    if rate >= easy:
        return "easy"
    if rate == 0.0:
        return "hard"
    return "medium" if 0.25 <= rate <= 0.75 else None


def split(
    rows: list[dict[str, Any]], args: argparse.Namespace, seed: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training rows, held-out rows): --rows and --held of each level, disjoint."""
    train: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    for name in LEVELS:
        pool = [r for r in rows if level(r["pass_rate"], args.easy) == name]
        if len(pool) < args.rows + args.held:
            raise SystemExit(
                f"only {len(pool)} {name} problems among {len(rows)} candidates (need "
                f"{args.rows + args.held}): raise --operands or --probe-samples, or lower --rows"
            )
        random.Random(f"{seed}:{name}").shuffle(pool)
        keep = [{**r, "level": name} for r in pool[: args.rows + args.held]]
        train += keep[: args.rows]
        evals += keep[args.rows :]
    return train, evals


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def default_task_rows(count: int) -> list[dict[str, Any]]:
    """`count` problems of the default task (arith), from indices training never reaches."""
    from grpo_stream.tasks import TaskSettings, make_task

    task = make_task(TaskSettings())
    problems = [task.problem(10**9 + i) for i in range(count)]
    return [{"question": p.prompt, "answer": p.reference["answer"]} for p in problems]


def dataset(args: argparse.Namespace, scorer: Scorer) -> dict[str, list[dict[str, Any]]]:
    """The built dataset's training and held-out rows (probed, then split by level)."""
    probed = probe(args, scorer)
    train_rows, eval_rows = split(probed, args)
    print(
        f"dataset: {len(probed)} candidates probed ({args.probe_samples} samples, T "
        f"{args.temperature}); {len(train_rows)} training and {len(eval_rows)} held-out "
        "problems, a third of each level",
        flush=True,
    )
    return {"dataset": train_rows, "held_out": eval_rows}
