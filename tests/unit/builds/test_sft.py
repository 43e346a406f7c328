"""The shared warm start: deterministic for a seed, trains, and stops at the first
evaluation that reaches the target; the builders' shared tail measures what it saved."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from grpo_stream.builds import sft
from grpo_stream.builds.sft import WarmStart, pad_rows
from grpo_stream.builds.tiny import build_tokenizer
from grpo_stream.models.testing import tiny_qwen2


def batches(rng: random.Random) -> sft.Batch:
    """Rows `a b (a+b)%10` over a 12-token vocabulary, loss on the last token only."""
    rows = []
    for _ in range(8):
        a, b = rng.randrange(10), rng.randrange(10)
        rows.append(([a, b, (a + b) % 10], [-100, -100, (a + b) % 10]))
    return pad_rows(rows, pad_id=11)


def model() -> Any:
    return tiny_qwen2(vocab=12, seed=0, train=True)


def params(m: Any) -> list[torch.Tensor]:
    return [p.detach().clone() for p in m.parameters()]


def test_pad_rows_right_pads_ids_and_masks_labels() -> None:
    ids, mask, labels = pad_rows([([1, 2, 3], [-100, 2, 3]), ([4], [4])], pad_id=0)
    assert ids.tolist() == [[1, 2, 3], [4, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert labels.tolist() == [[-100, 2, 3], [4, -100, -100]]


def test_the_same_seed_gives_the_same_weights_and_training_changes_them() -> None:
    plan = WarmStart(batches, score=lambda m: 0.0, target=1.0, max_steps=6, eval_every=3)
    first, second = model(), model()
    before = params(first)
    assert sft.warm_start(first, plan, seed=1) == (6, 0.0)
    sft.warm_start(second, plan, seed=1)
    after = params(first)
    assert all(torch.equal(a, b) for a, b in zip(after, params(second), strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_it_stops_at_the_first_evaluation_reaching_the_target() -> None:
    scores = iter([0.1, 0.2, 0.35, 0.9])
    seen: list[int] = []

    def score(m: Any) -> float:
        seen.append(1)
        return next(scores)

    plan = WarmStart(batches, score=score, target=0.3, max_steps=100, eval_every=2)
    assert sft.warm_start(model(), plan, seed=0) == (6, 0.35)
    assert len(seen) == 3


def test_finish_measures_the_model_as_saved_and_loaded_back(tmp_path: Path) -> None:
    tokenizer = build_tokenizer()
    built = tiny_qwen2(vocab=len(tokenizer), seed=3)
    rounded = params(built.to(torch.bfloat16).float())
    seen: dict[str, Any] = {}

    def measure(saved: Any, reloaded: Any) -> dict[str, Any]:
        seen["weights"], seen["tokens"] = params(saved), reloaded("1+2=")["input_ids"]
        return {}

    sft.finish(built, tokenizer, tmp_path / "out", {}, measure, time.perf_counter())
    assert all(p.dtype == torch.float32 for p in seen["weights"])
    assert all(torch.equal(a, b) for a, b in zip(seen["weights"], rounded, strict=True))
    assert seen["tokens"] == tokenizer("1+2=")["input_ids"]


def test_finish_writes_fields_measures_size_and_torch_and_returns_the_time(tmp_path: Path) -> None:
    tokenizer = build_tokenizer()
    built = tiny_qwen2(vocab=len(tokenizer), seed=3)
    size = sum(p.numel() for p in built.parameters())
    info = sft.finish(
        built, tokenizer, tmp_path, {"seed": 3, "sft_steps": 7}, lambda m, t: {"rate": 0.5}, 0.0
    )
    written = json.loads((tmp_path / "build_info.json").read_text())
    expected = {"seed": 3, "sft_steps": 7, "rate": 0.5, "parameters": size}
    assert list(written.items()) == [*expected.items(), ("torch", torch.__version__)]
    assert info == {**written, "build_seconds": info["build_seconds"]}
    assert info["build_seconds"] > 0


def test_build_info_opens_with_seed_base_steps_and_target_then_what_was_measured_at_stop() -> None:
    built = sft.Built(seed=1, sft_steps=40, target=0.3, base="grpo-stream/tiny-arith")
    assert list(built.fields(rate_at_stop=0.31).items()) == [
        ("seed", 1),
        ("base", "grpo-stream/tiny-arith"),
        ("sft_steps", 40),
        ("target", 0.3),
        ("rate_at_stop", 0.31),
    ]
    assert list(sft.Built(0, 255, 0.3).fields()) == ["seed", "sft_steps", "target"]
