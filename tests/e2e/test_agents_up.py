"""`grpo-stream up --task calc-tools` end to end: the shipped calc agent (the openai client)
in the generator's agent sandbox calls a JSON function through the generator's
OpenAI-compatible endpoint, on the shipped tiny-tools model; real hub, generator and
trainer processes; every episode group ends exactly once and training moves the weights."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from grpo_stream.training.metrics import read_metrics

from .conftest import assert_accounting, changed_parameters, finished_up, hub_events, service_events

STEPS = 3
GROUPS = 4  # hub.groups_per_step in SMALL
EPISODES = 4  # generator.group_size in SMALL


@pytest.fixture(scope="module")
def agent_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("agents") / "run"
    return finished_up(run_dir, STEPS, "--task", "calc-tools", timeout=280)


@pytest.mark.slow
def test_the_openai_client_agent_calls_the_tool_through_the_endpoint(agent_run: Path) -> None:
    assert service_events(agent_run, "generator", "agent.endpoint_started")
    batches = service_events(agent_run, "generator", "agent.batch_played")
    assert batches and sum(int(b["episodes"]) for b in batches) >= GROUPS * EPISODES * STEPS
    assert sum(int(b["tool_calls"]) for b in batches) > 0  # the model called calc
    # only the batch in flight when the run stops may fail (its agents cancelled)
    assert sum(int(b["episodes_failed"]) for b in batches[:-1]) == 0
    # ... and only as the stop ends it: cancelled, or its worker gone with the generator
    failed = service_events(agent_run, "generator", "agent.episode_failed")
    assert all(
        f["error"] == "the generator is stopping" or f["error"].startswith("agent worker died")
        for f in failed
    ), {f["error"] for f in failed}
    assert not list((agent_run / "logs").glob("scorer-*"))  # the agent rewards its episodes


@pytest.mark.slow
def test_every_agent_group_ends_once_and_each_step_trains_whole_groups(agent_run: Path) -> None:
    counters = assert_accounting(agent_run, STEPS, GROUPS)  # and no group trained twice
    assert counters["failed"] == 0 and counters["duplicates_dropped"] == 0
    rows = read_metrics(agent_run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    # a step may run short by dynamic sampling's holes (zero-signal groups past the refill
    # budget, common on the tiny model): the hub logs which whole groups it served
    # (batch.sent names the step the trainer asked at: the one it had done, so the metrics'
    # step is one more)
    sent = {int(e["step"]) + 1: e for e in hub_events(agent_run, "batch.sent")}
    for row in rows:
        served = sent[int(row["step"])]
        groups = len(served["groups"])
        assert groups >= 1 and groups + int(served["short"]) == GROUPS
        assert row["sequences"] == served["sequences"] == groups * EPISODES  # one per episode
        assert 0.0 <= row["reward_mean"] <= 1.0 and math.isfinite(row["reward_mean"])


@pytest.mark.slow
def test_agent_training_changes_the_tiny_tools_parameters(agent_run: Path) -> None:
    ckpt = agent_run / "checkpoints" / f"step-{STEPS}"
    assert changed_parameters(ckpt, "grpo-stream/tiny-tools")
