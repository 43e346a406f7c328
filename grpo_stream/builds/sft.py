"""The supervised warm start shared by the shipped tiny models' builders (tiny, guess, calc,
tools, judge): each gives its data (a batch sampler) and its scorer (what stops SFT); this
module owns the loop, the stopping rule and the build's tail (`finish`: save, reload,
measure, build_info.json).

Invariants: for a given seed, torch version and thread count the loop is deterministic
(one `random.Random(seed)` drives the batches, fixed AdamW settings, the scorer is called
every `eval_every` steps only); SFT stops at the first evaluation whose score reaches the
target; the weights are saved in bfloat16 with the keys older transformers read, and
build_info.json holds no wall time, so a rebuild writes the same file.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpo_stream.engines.hf import HFEngine
from grpo_stream.envs.episodes import EpisodeRun, run_episodes
from grpo_stream.envs.local import LocalEnvs
from grpo_stream.envs.turns import TurnFormat
from grpo_stream.models.loading import load_policy
from grpo_stream.sampling import Sampling

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""input_ids, attention_mask and labels (-100 where no loss), each (B, T), right-padded."""


def pad_rows(rows: list[tuple[list[int], list[int]]], pad_id: int) -> Batch:
    """The batch of (token ids, labels) rows, right-padded with `pad_id` (labels -100)."""
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # (B, T)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)  # (B, T)
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # (B, T)
    for i, (row, lab) in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        labels[i, : len(row)] = torch.tensor(lab)
        mask[i, : len(row)] = 1
    return ids, mask, labels


@dataclass(frozen=True)
class WarmStart:
    """One warm start: what to train on and when to stop."""

    batches: Callable[[random.Random], Batch]
    """The next training batch, drawn with the loop's seeded generator."""
    score: Callable[[Any], float]
    """The model's score (accuracy, success rate): SFT stops once it reaches `target`."""
    target: float
    max_steps: int
    eval_every: int
    label: str = "score"
    """The score's name in the progress lines."""
    lr: float = 1e-3
    """AdamW's learning rate."""


def warm_start(model: Any, plan: WarmStart, seed: int) -> tuple[int, float]:
    """SFT until `plan.score` reaches `plan.target`: (steps taken, last score)."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=plan.lr, weight_decay=0.0)
    model.train()
    score = 0.0
    for step in range(1, plan.max_steps + 1):
        ids, mask, labels = plan.batches(rng)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % plan.eval_every == 0:
            score = plan.score(model)
            print(f"step {step:4d} loss {loss.item():.3f} {plan.label} {score:.3f}", flush=True)
            if score >= plan.target:
                return step, score
    return plan.max_steps, score


def _patch_json(path: Path, **fields: Any) -> None:
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data, indent=2) + "\n")


def compat_for_older_readers(out: Path) -> None:
    """Also write the keys that transformers 4.x (and vLLM hosts that pin it) read.

    transformers 5 writes `dtype`, `rope_parameters` and `TokenizersBackend`; 4.x reads
    `torch_dtype`, `rope_theta` and knows PreTrainedTokenizerFast. 5.x accepts both.
    """
    config = json.loads((out / "config.json").read_text())
    theta = config.get("rope_parameters", {}).get("rope_theta", config.get("rope_theta"))
    _patch_json(out / "config.json", torch_dtype="bfloat16", rope_theta=theta)
    _patch_json(out / "tokenizer_config.json", tokenizer_class="PreTrainedTokenizerFast")


def save(model: Any, tokenizer: Any, out: Path) -> None:
    """Save the model in bfloat16 and its tokenizer to `out`, readable by transformers 4/5."""
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    compat_for_older_readers(out)


def write_info(out: Path, info: dict[str, Any]) -> None:
    """build_info.json: what the build measured on the saved weights (no wall time)."""
    (out / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")


@dataclass(frozen=True)
class Built:
    """What every build_info.json opens with: the seed, the SFT steps the warm start ran and
    the target it stopped at (after the seed, the model it started from where it
    fine-tunes a shipped one)."""

    seed: int
    sft_steps: int
    target: float
    base: str | None = None

    def fields(self, **at_stop: Any) -> dict[str, Any]:
        """These, then `at_stop` (what the build measured when SFT stopped), in order."""
        base = {} if self.base is None else {"base": self.base}
        head = {"seed": self.seed, **base, "sft_steps": self.sft_steps, "target": self.target}
        return {**head, **at_stop}


def finish(
    model: Any,
    tokenizer: Any,
    out: Path,
    fields: dict[str, Any],
    measure: Callable[[Any, Any], dict[str, Any]],
    started: float,
) -> dict[str, Any]:
    """Every builder's tail: save the model and tokenizer to `out` (`save`), load them back
    as a user would (fp32 weights, the saved tokenizer), `measure(model, tokenizer)` them,
    write build_info.json (`fields`, the measures, the parameter count and torch's version,
    in that order) and return it with the build's seconds since `started`."""
    from transformers import AutoTokenizer  # heavy: only a build needs it

    save(model, tokenizer, out)
    saved = load_policy(str(out), dtype="float32", trainable=False)
    measured = measure(saved, AutoTokenizer.from_pretrained(out))
    info = {
        **fields,
        **measured,
        "parameters": sum(p.numel() for p in saved.parameters()),
        "torch": torch.__version__,
    }
    write_info(out, info)
    return {**info, "build_seconds": round(time.perf_counter() - started, 1)}


def build_main(
    doc: str | None,
    build: Callable[..., dict[str, Any]],
    out: str,
    target: float,
    max_steps: int,
    argv: list[str] | None = None,
) -> dict[str, Any]:
    """The command line of a builder: --out, --seed, --target, --max-steps; prints the info."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--out", type=Path, default=Path(out))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=target, help="Stop SFT at this score.")
    parser.add_argument("--max-steps", type=int, default=max_steps)
    args = parser.parse_args(argv)
    info = build(args.out, seed=args.seed, target=args.target, max_steps=args.max_steps)
    print(json.dumps(info, indent=2))
    return info


def sampled_episodes(
    model: Any,
    tokenizer: Any,
    env: Callable[[], Any],
    settings: Any,
    problems: list[tuple[str, dict[str, Any]]],
    samples: int,
    sampling: Sampling,
) -> list[Any]:
    """Episodes of every problem `samples` times, each turn sampled as `sampling` says by
    the hf engine's turn loop against in-process environments (`env` builds one; `settings`
    is the run's EnvSettings). The model's train/eval mode is restored."""
    was_training = model.training
    run = EpisodeRun(
        prompts=[p for p, _ in problems],
        references=[r for _, r in problems],
        group_size=samples,
        sampling=sampling,
    )
    engine, fmt = HFEngine(model, tokenizer), TurnFormat(tokenizer, False)
    groups = run_episodes(engine, tokenizer, LocalEnvs(env), fmt, settings, run)
    model.train(was_training)
    return [e for g in groups for e in g]
