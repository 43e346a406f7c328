"""The run directory as the dashboard reads it: each update is what the files gained, and a
snapshot equals everything the updates carried; alarms are counted per instance and event."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from grpo_stream.dashboard.rundir import MAX_COMPLETIONS, MAX_TEXT, RunFiles
from grpo_stream.training import samples
from grpo_stream.training.samples import CompletionLog, Sample


def _append(path: Path, *rows: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)


def _event(event: str, level: str = "info", t: float = 1.0, **fields: Any) -> dict[str, Any]:
    return {"event": event, "level": level, "t": t, "instance": "trainer-0",
            "service": "trainer", **fields}  # fmt: skip


def test_an_empty_run_directory_reads_as_an_empty_run(tmp_path: Path) -> None:
    files = RunFiles(tmp_path)
    update = files.apply(files.collect())
    assert update.as_json() == {"metrics": [], "completions": [], "evals": [], "alarms": []}
    assert files.snapshot() == update.as_json()


def test_updates_carry_what_was_added_and_add_up_to_the_snapshot(tmp_path: Path) -> None:
    files = RunFiles(tmp_path)
    _append(tmp_path / "metrics.jsonl", {"step": 1, "kl": 0.1, "not_drawn": 5})
    first = files.apply(files.collect())
    _append(tmp_path / "metrics.jsonl", {"step": 2, "kl": 0.2})
    _append(tmp_path / "eval.jsonl", {"step": 2, "eval/pass@1": 0.5})
    second = files.apply(files.collect())
    assert first.metrics == [{"step": 1, "kl": 0.1}]  # only the columns the page draws
    assert second.metrics == [{"step": 2, "kl": 0.2}]
    assert second.evals == [{"step": 2, "eval/pass@1": 0.5}]
    snap = files.snapshot()
    assert snap["metrics"] == first.metrics + second.metrics
    assert snap["evals"] == second.evals


def _samples(steps: range, prompt: str = "1+1=") -> list[Sample]:
    return [Sample(s, prompt, str(s), 1.0, 0.5, s - 1, 2) for s in steps]


def test_completions_are_the_trainers_samples_newest_kept_long_texts_cut(tmp_path: Path) -> None:
    log = CompletionLog(tmp_path, every=1, prompts=1)
    log.write(_samples(range(MAX_COMPLETIONS + 5), "p" * (MAX_TEXT + 10)), [])
    files = RunFiles(tmp_path)
    files.apply(files.collect())
    kept = files.snapshot()["completions"]
    assert [c["step"] for c in kept] == list(range(5, MAX_COMPLETIONS + 5))
    assert len(kept[0]["prompt"]) == MAX_TEXT
    assert kept[-1] | {"prompt": ""} == asdict(_samples(range(54, 55))[0]) | {"prompt": ""}


def test_completions_arrive_once_each_and_only_whole(tmp_path: Path) -> None:
    log = CompletionLog(tmp_path, every=1, prompts=1)
    files = RunFiles(tmp_path)
    log.write(_samples(range(1, 3)), [])
    assert [c["step"] for c in files.apply(files.collect()).completions] == [1, 2]
    assert files.apply(files.collect()).completions == []
    with log.path.open("a") as fh:
        fh.write(json.dumps(asdict(_samples(range(3, 4))[0]))[:20])  # the trainer mid-line
    assert files.apply(files.collect()).completions == []
    with log.path.open("a") as fh:
        fh.write(json.dumps(asdict(_samples(range(3, 4))[0]))[20:] + "\n")
    log.write(_samples(range(4, 5)), [])
    assert [c["step"] for c in files.apply(files.collect()).completions] == [3, 4]
    assert [c["step"] for c in files.snapshot()["completions"]] == [1, 2, 3, 4]


def test_completions_are_read_again_only_when_the_file_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[Path] = []
    real = samples.read_samples
    monkeypatch.setattr(samples, "read_samples", lambda d: reads.append(d) or real(d))
    files = RunFiles(tmp_path)
    files.apply(files.collect())  # no file: nothing read
    CompletionLog(tmp_path, every=1, prompts=1).write(_samples(range(1, 2)), [])
    for _ in range(3):
        files.apply(files.collect())
    assert reads == [tmp_path]


def test_warnings_and_errors_become_alarms_counted_per_instance_and_event(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "grouper-grouper-0.jsonl"
    stall = {"instance": "grouper-0", "service": "grouper"}
    _append(log, _event("hub.stall", "warning", 1.0, why="no scorer connected", **stall))
    _append(log, _event("weights.applied", "info", 2.0, version=3))
    _append(log, _event("grpo.rollback", "warning", 3.0, step=7))
    files = RunFiles(tmp_path)
    first = files.apply(files.collect())
    assert sorted((a.kind, a.event, a.count) for a in first.alarms) == [
        ("rollback", "grpo.rollback", 1),
        ("stall", "hub.stall", 1),
    ]
    _append(log, _event("hub.stall", "warning", 4.0, why="generators idle", **stall))
    _append(log, _event("reward.error", "error", 5.0, error="ZeroDivisionError"))
    second = files.apply(files.collect())
    changed = {(a.event, a.count, a.text) for a in second.alarms}
    assert ("hub.stall", 2, "why=generators idle") in changed  # counted, newest text
    assert ("reward.error", 1, "error=ZeroDivisionError") in changed
    assert [a["event"] for a in files.snapshot()["alarms"]] == [
        "reward.error", "hub.stall", "grpo.rollback",  # newest first
    ]  # fmt: skip


def test_the_logs_tell_which_services_ran_on_which_device_at_which_version(
    tmp_path: Path,
) -> None:
    log = tmp_path / "logs" / "generator-generator-0.jsonl"
    gen = {"instance": "generator-0", "service": "generator"}
    _append(log, _event("engine.loaded", t=1.0, device="cuda:0", **gen))
    _append(log, _event("weights.applied", t=2.0, version=4, **gen))
    _append(log, _event("weights.applied", t=3.0, version=5, **gen))
    files = RunFiles(tmp_path)
    files.apply(files.collect())
    seen = files.logged["generator-0"]
    assert (seen.service, seen.device, seen.version, seen.last_t) == ("generator", "cuda:0", 5, 3.0)
