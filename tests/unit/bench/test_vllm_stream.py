"""bench.vllm_stream without vLLM: its options, the run config it gives the generator, the
hub's record of latencies, and how the stand-in trainer counts token staleness."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from grpo_stream.protocols import messages as m

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO))
    common = importlib.import_module("bench.common")
    monkeypatch.setattr(common, "_smoke_dir", None)  # a --smoke parse sets it: undone after
    return importlib.import_module("bench.vllm_stream")


def test_defaults_are_the_long_tailed_workload_and_smoke_is_tiny(bench: ModuleType) -> None:
    args = bench.parse_args([])
    assert (args.max_tokens, args.group_size, args.prompts) == (256, 8, 256)
    assert args.prompts_per_request is None  # the default credits: the engine's capacity
    assert args.out == REPO / "bench" / "results" / "vllm_stream.json"
    smoke = bench.parse_args(["--smoke"])
    assert smoke.prompts * smoke.group_size * smoke.max_tokens <= 8 * 4 * 32
    assert smoke.out.name == "vllm_stream.json" and REPO not in smoke.out.parents
    assert bench.parse_args(["--smoke", "--prompts", "3"]).prompts == 3  # an option given wins


def test_the_generator_config_is_a_valid_vllm_run(bench: ModuleType, tmp_path: Path) -> None:
    parts = importlib.import_module("bench.vllm_stream_parts")
    args = bench.parse_args([])
    cfg = parts.run_config(args, tmp_path, inflight=True)
    assert cfg.generator.engine == "vllm" and cfg.generator.inflight_updates
    assert cfg.generator.max_tokens == 256 and cfg.trainer.micro_batch_tokens > 256


def test_latency_is_dispatch_to_arrival_and_time_spans_first_to_last(bench: ModuleType) -> None:
    parts = importlib.import_module("bench.vllm_stream_parts")
    record = parts.Record(dispatched={0: 1.0, 1: 1.0, 2: 2.0}, arrived={0: 1.5, 1: 4.0, 2: 3.0})
    assert record.latencies() == [0.5, 1.0, 3.0]
    assert record.seconds() == 3.0


def _rollout(versions: list[int], starts: list[int], ids: int, policy: int) -> m.Rollout:
    empty = np.zeros(0, np.int64)
    return m.Rollout(
        lease_id=1, group_id=0, instance="g", policy_version=policy,
        prompt_ids=np.zeros(1, np.int32), completion_ids=np.zeros(ids, np.int32),
        completion_offsets=np.array([0, ids], np.int64), logprobs=np.zeros(ids, np.float32),
        texts=["x"], truncated=[False], gen_seconds=0.1,
        sampling=m.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=8),
        token_version_starts=np.array(starts, np.int64) if starts else empty,
        token_versions=np.array(versions, np.int64) if versions else empty,
    )  # fmt: skip


def test_token_staleness_counts_each_token_by_the_version_that_sampled_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(REPO))
    trainer_mod = importlib.import_module("bench.vllm_stream_inflight")
    trainer = trainer_mod.StandInTrainer(None, [], None, first_version=5)
    trainer._take(_rollout([3, 5], [0, 6], ids=10, policy=3))  # 6 tokens of v3, 4 of v5
    trainer._take(_rollout([], [], ids=4, policy=4))  # one version: the runs are not sent
    assert trainer.tokens == 14 and trainer.groups == 2 and trainer.mixed == 1
    assert trainer.token_age == 6 * 2 + 4 * 0 + 4 * 1
