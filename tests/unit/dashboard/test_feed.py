"""The feed: a page gets a snapshot then each update; nothing is polled while no page is
open; a page that does not keep up is dropped."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from grpo_stream.dashboard import feed as feed_module
from grpo_stream.dashboard.feed import Feed, sse
from grpo_stream.dashboard.source import RunSource
from grpo_stream.rundir.outcome import write_outcome

POLL_S = 0.1


def _event(text: str) -> tuple[str, dict[str, Any]]:
    name, data = text.strip().split("\n")
    return name.removeprefix("event: "), json.loads(data.removeprefix("data: "))


def _run(tmp_path: Path, steps: int) -> RunSource:
    rows = "".join(json.dumps({"step": s, "kl": 0.01 * s}) + "\n" for s in range(1, steps + 1))
    (tmp_path / "metrics.jsonl").write_text(rows)
    write_outcome(tmp_path, "completed", steps)
    return RunSource(tmp_path)


def test_a_page_gets_a_snapshot_then_each_update(tmp_path: Path) -> None:
    feed = Feed(_run(tmp_path, 3), POLL_S)

    async def two_events() -> list[tuple[str, dict[str, Any]]]:
        stream = feed.stream()
        first = _event(await anext(stream))
        with (tmp_path / "metrics.jsonl").open("a") as fh:
            fh.write(json.dumps({"step": 4, "kl": 0.04}) + "\n")
        second = _event(await anext(stream))
        while not second[1]["files"]["metrics"]:  # a poll may have landed before the write
            second = _event(await anext(stream))
        await stream.aclose()
        return [first, second]

    (name1, snap), (name2, update) = asyncio.run(two_events())
    assert name1 == "snapshot" and [r["step"] for r in snap["files"]["metrics"]] == [1, 2, 3]
    assert snap["run"]["phase"] == "completed" and snap["info"]["name"] == tmp_path.name
    assert name2 == "update" and update["files"]["metrics"] == [{"step": 4, "kl": 0.04}]


def test_nothing_is_polled_while_no_page_is_open(tmp_path: Path) -> None:
    feed = Feed(_run(tmp_path, 2), POLL_S)

    async def scenario() -> tuple[int, int, int]:
        await asyncio.sleep(5 * POLL_S)
        before = feed.polls  # no page yet
        stream = feed.stream()
        await anext(stream)
        await anext(stream)
        await stream.aclose()
        await asyncio.sleep(3 * POLL_S)  # the poller notices the last page left
        after_leaving = feed.polls
        await asyncio.sleep(10 * POLL_S)
        return before, after_leaving, feed.polls

    before, after_leaving, later = asyncio.run(scenario())
    assert before == 0
    assert after_leaving >= 2 and later == after_leaving


def test_a_page_that_falls_behind_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(feed_module, "MAX_BEHIND", 2)
    feed = Feed(_run(tmp_path, 1), poll_s=60.0)  # polls only when asked below

    async def scenario() -> list[str]:
        stream = feed.stream()
        got = [await anext(stream)]  # the snapshot; then it reads nothing for a while
        for _ in range(5):
            await feed.state()  # each makes an update for every page
        got += [item async for item in stream]  # what was queued, then the end
        return got

    got = asyncio.run(scenario())
    assert feed.subscribers == 0
    assert [_event(g)[0] for g in got] == ["snapshot", "update"]  # the rest was dropped


def test_events_carry_json_without_nan() -> None:
    name, data = _event(sse("update", {"x": float("nan"), "y": [1.5, float("inf")]}))
    assert (name, data) == ("update", {"x": None, "y": [1.5, None]})
