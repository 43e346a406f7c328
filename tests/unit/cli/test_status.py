"""`grpo-stream status` on a run that is over answers from the run directory at once: how it
ended, steps, counters, last metrics, checkpoints."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from grpo_stream.cli.main import app
from grpo_stream.rundir.final import complete_steps
from grpo_stream.rundir.outcome import write_outcome

from ..rundir.holder import held_elsewhere


def _finished_run(run_dir, steps: int = 3):
    (run_dir / "hub").mkdir(parents=True)
    rows = [
        {"step": s, "reward_mean": 0.25 * s, "pass_rate": 0.5, "kl": 0.0}
        for s in range(1, steps + 1)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "hub" / "counters.json").write_text(json.dumps({"trained": 12, "filtered": 4}))
    for step, complete in ((2, True), (3, True), (4, False)):
        ckpt = run_dir / "checkpoints" / f"step-{step}"
        ckpt.mkdir(parents=True)
        if complete:
            (ckpt / "COMPLETE").write_text("")


def test_a_finished_run_shows_its_final_state(tmp_path):
    _finished_run(tmp_path)
    write_outcome(tmp_path, "completed", 3)
    result = CliRunner().invoke(app, ["status", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "completed" in result.output and "after 3 steps" in result.output
    assert "reward_mean=0.75" in result.output
    assert "trained=12 filtered=4" in result.output
    assert "step-2, step-3" in result.output  # step-4 never completed


def test_a_run_whose_up_was_killed_is_called_dead_with_how_to_resume(tmp_path):
    _finished_run(tmp_path)
    result = CliRunner().invoke(app, ["status", str(tmp_path), "--json"])
    state = json.loads(result.output)
    assert state["ended"] == "dead" and state["steps"] == 3
    text = CliRunner().invoke(app, ["status", str(tmp_path)]).output
    assert f"grpo-stream up --resume --run-dir {tmp_path}" in text


def test_a_failed_run_says_why(tmp_path):
    _finished_run(tmp_path)
    write_outcome(tmp_path, "failed", 3, "grouper-0 exited with code 4: stalled")
    result = CliRunner().invoke(app, ["status", str(tmp_path)])
    assert "why: grouper-0 exited with code 4: stalled" in result.output


def test_a_live_run_is_asked_through_its_hub(tmp_path):
    _finished_run(tmp_path)
    with held_elsewhere(tmp_path):
        result = CliRunner().invoke(app, ["status", str(tmp_path)])
    assert result.exit_code == 2
    assert "hub.addr does not exist" in result.output  # it went for the hub


def test_complete_steps_agree_with_the_checkpoint_module(tmp_path):
    from grpo_stream.training.checkpoint import complete_checkpoints

    _finished_run(tmp_path)
    assert complete_steps(tmp_path) == [s for s, _ in complete_checkpoints(tmp_path)] == [2, 3]
