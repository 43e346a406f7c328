"""`grpo-stream up` refuses bad inputs before it starts anything: exit 2, one line, no run
directory; `up --check` runs only the pre-flight checks."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from grpo_stream.cli.main import app


def _up(tmp_path, *args: str):
    return CliRunner().invoke(app, ["up", "--run-dir", str(tmp_path / "run"), *args])


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--set", "task.name=countdown"], "prompts do not fit the model"),
        (["--set", 'model.name_or_path="./no-such-model"'], "model.name_or_path"),
        (["--set", "task.name=math", "--set", 'task.path="nope.jsonl"'], "task.path"),
        (["--config", "."], "is a directory"),
        (["--config", "no-such.toml"], "does not exist"),
        (["--set", "trainer.lr=-1"], "trainer.lr"),
        (["--set", "trainer.lrr=1e-4"], "(did you mean trainer.lr?)"),
        (["--launcher", "k8s"], "--launcher k8s: choose one of local, ray"),
        (["--address", "10.0.0.1:6379"], "it needs --launcher ray"),
        (["--launcher", "ray", "--cluster", "c.toml"], "drop --cluster"),
        (
            ["--set", "trainer.context_parallel=3", "--set", "trainer.ranks=3"],
            "trainer.context_parallel = 3 does not divide the 2 attention heads",
        ),
    ],
    ids=[
        "prompts-too-long",
        "model-path",
        "data-file",
        "config-dir",
        "config-missing",
        "value",
        "mistyped-key",
        "launcher",
        "address",
        "ray-and-cluster",
        "context-parallel-heads",
    ],
)
def test_a_bad_input_exits_2_with_one_line_and_no_run_dir(tmp_path, args, says):
    result = _up(tmp_path, *args)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], lines
    assert not (tmp_path / "run").exists()


def test_check_runs_only_the_checks_and_exits_0(tmp_path):
    result = _up(tmp_path, "--check")
    assert result.exit_code == 0, result.output
    assert [line.split(":")[0] for line in result.output.splitlines()] == [
        "ok  model",
        "ok  data",
        "ok  fit",
        "ok  compatible",
        "ok  run dir",
    ]
    assert not (tmp_path / "run").exists()


def test_check_exits_2_on_a_bad_input(tmp_path):
    result = _up(tmp_path, "--check", "--set", "task.name=countdown")
    assert result.exit_code == 2
    assert "prompts do not fit" in result.output


READS_PRODUCT = """
def accuracy(completion, *, prompt, reference):
    return float(completion.strip() == reference["product"])
"""


def test_a_reward_that_raises_stops_up_before_any_service_starts(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(READS_PRODUCT)
    monkeypatch.chdir(tmp_path)
    result = _up(tmp_path, "--set", 'task.rewards=[{name="my_rewards:accuracy"}]')
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: reward 'my_rewards:accuracy'"), lines
    assert "raised KeyError: 'product' (my_rewards.py:3 in accuracy)" in lines[0]
    assert not (tmp_path / "run").exists()
