"""The scorer's loop (grpo_stream.services.scorer) against a real hub socket: it pulls work
with credits, scores with the task's rewards, asks for one more group per group scored, and
asks for its whole window again after the hub restarts."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from grpo_stream.config import RunConfig, config_from_dict
from grpo_stream.config.transport import SecuritySettings
from grpo_stream.protocols import messages as m
from grpo_stream.services.scorer import serve_scorer
from grpo_stream.session.service import Join, Session, StopFlag

sys.path.insert(0, str(Path(__file__).parents[1] / "session"))
from hub_script import ScriptedHub


class Running:
    """serve_scorer in a thread (its session lives there), stopped by the test."""

    def __init__(self, hub: ScriptedHub) -> None:
        self.stop = StopFlag()
        self.session = Session(Join("scorer", "sc-0", hub.address, SecuritySettings()), self.stop)
        self.code: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.session.connect()
        try:
            self.code = serve_scorer(self.session)
        finally:
            self.session.close("done")

    def close(self) -> None:
        self.stop.stop("test")
        self.thread.join(30)


@pytest.fixture
def cfg(tmp_path: Path) -> RunConfig:
    return config_from_dict(
        {
            "run": {"run_dir": str(tmp_path)},
            "scorer": {"groups_per_request": 3, "workers": 1},
            "transport": {"heartbeat_interval_s": 0.1, "heartbeat_timeout_s": 1.0},
        }
    )


@pytest.fixture
def hub(cfg: RunConfig) -> Iterator[ScriptedHub]:
    fake = ScriptedHub(cfg)
    yield fake
    fake.close()


def test_the_scorer_scores_a_group_and_asks_for_one_more(hub: ScriptedHub) -> None:
    scorer = Running(hub)
    try:
        first = hub.wait_for(m.WorkRequest)[0]
        assert first.credits == 3  # type: ignore[attr-defined]
        request = m.ScoreRequest(
            lease_id=7, group_id=11, prompt="3+4=", completions=["7", "8", " 7 "],
            reference={"answer": "7"},
        )  # fmt: skip
        hub.send("sc-0", request)
        scored = hub.wait_for(m.Scored)[0]
        assert isinstance(scored, m.Scored)
        assert (scored.lease_id, scored.group_id) == (7, 11)
        # arith's reward is exact match after stripping white space
        np.testing.assert_array_equal(scored.rewards, np.array([1.0, 0.0, 1.0], np.float32))
        replenish = hub.wait_for(m.WorkRequest, count=2)[1]
        assert replenish.credits == 1  # type: ignore[attr-defined]
    finally:
        scorer.close()
    assert scorer.code == 0
    assert hub.wait_for(m.Shutdown)[0].reason == "done"  # type: ignore[attr-defined]


def test_groups_sent_together_all_come_back_and_the_heartbeat_counts_their_cost(
    hub: ScriptedHub,
) -> None:
    scorer = Running(hub)
    try:
        hub.wait_for(m.WorkRequest)
        for group_id in (1, 2, 3):
            answer = str(group_id)
            request = m.ScoreRequest(
                lease_id=9,
                group_id=group_id,
                prompt="p",
                completions=[answer, "0", answer, "x"],
                reference={"answer": answer},
            )
            hub.send("sc-0", request)
        scored = hub.wait_for(m.Scored, count=3)
        assert sorted(s.group_id for s in scored) == [1, 2, 3]  # type: ignore[attr-defined]
        for s in scored:
            np.testing.assert_array_equal(s.rewards, [1.0, 0.0, 1.0, 0.0])  # type: ignore[attr-defined]
        beat = hub.wait_for(m.Heartbeat, where=_counted(12))[0]
        stats = beat.scorer  # type: ignore[attr-defined]
        assert (stats.completions, stats.groups, stats.calls, stats.workers) == (12, 3, 9, 1)
        assert stats.cpu_s > 0
    finally:
        scorer.close()


def _counted(completions: int) -> Callable[[m.Message], bool]:
    def done(msg: m.Message) -> bool:
        stats = msg.scorer  # type: ignore[attr-defined]
        return stats is not None and stats.completions == completions

    return done


def test_the_scorer_asks_for_its_window_again_after_the_hub_restarts(
    hub: ScriptedHub, cfg: RunConfig
) -> None:
    scorer = Running(hub)
    hub.wait_for(m.WorkRequest)
    hub.close()
    again = ScriptedHub(cfg, address=hub.address)
    try:
        asked = again.wait_for(m.WorkRequest, timeout_s=30)[0]
        assert asked.credits == 3  # type: ignore[attr-defined]
        assert [h.instance for h in again.of(m.Hello)] == ["sc-0"]  # type: ignore[attr-defined]
    finally:
        scorer.close()
        again.close()
