"""`up --resume` and `up --check` judge the run directory before anything starts: a resume
keeps the run's config, refuses what would change what is trained, needs steps left; `--check`
refuses a finished run directory as `up` would."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from grpo_stream.cli.main import app
from grpo_stream.config import load_config


def _run_dir(tmp_path: Path, trained: int) -> Path:
    """A run directory as `up` leaves it after `trained` steps of a run started with
    `--max-steps 300 --set trainer.lr=5e-5`."""
    run_dir = tmp_path / "run"
    cfg = load_config(None, [f'run.run_dir="{run_dir}"', "run.max_steps=300", "trainer.lr=5e-5"])
    (run_dir / "checkpoints" / f"step-{trained}").mkdir(parents=True)
    (run_dir / "checkpoints" / f"step-{trained}" / "COMPLETE").write_text("")
    (run_dir / "metrics.jsonl").write_text(f'{{"step": {trained}}}\n')
    (run_dir / "config.toml").write_text(cfg.to_toml())
    return run_dir


def _up(*args: str) -> tuple[int, list[str]]:
    result = CliRunner().invoke(app, ["up", *args])
    return result.exit_code, [line for line in result.output.splitlines() if line.strip()]


def test_check_refuses_a_run_directory_that_holds_a_run_as_up_does(tmp_path: Path) -> None:
    code, lines = _up("--check", "--run-dir", str(_run_dir(tmp_path, 101)))
    assert code == 2
    assert len(lines) == 1 and "already holds a run: pass --resume" in lines[0]


def test_resume_check_passes_on_the_saved_config(tmp_path: Path) -> None:
    code, lines = _up("--check", "--resume", "--run-dir", str(_run_dir(tmp_path, 101)))
    assert code == 0, lines


def test_resume_refuses_a_new_learning_rate_in_one_line(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, 101)
    code, lines = _up("--check", "--resume", "--run-dir", str(run_dir), "--set", "trainer.lr=1e-4")
    assert code == 2
    assert len(lines) == 1 and "trainer.lr is 5e-05 there" in lines[0]
    assert (run_dir / "config.toml").read_text().count("lr = 5e-05") == 1  # not rewritten


def test_resume_refuses_another_task_from_a_preset(tmp_path: Path) -> None:
    code, lines = _up(
        "--check", "--resume", "--run-dir", str(_run_dir(tmp_path, 101)), "--task", "guess"
    )
    assert code == 2
    assert len(lines) == 1 and "model.name_or_path is" in lines[0]
    assert "(so would task.name, " in lines[0]


def test_resume_of_a_run_that_trained_all_its_steps_asks_for_more(tmp_path: Path) -> None:
    code, lines = _up("--check", "--resume", "--run-dir", str(_run_dir(tmp_path, 300)))
    assert code == 2
    assert len(lines) == 1 and "has trained 300 steps" in lines[0] and "--max-steps" in lines[0]


def test_resume_with_more_steps_passes_the_check(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, 300)
    code, lines = _up("--check", "--resume", "--run-dir", str(run_dir), "--max-steps", "400")
    assert code == 0, lines
