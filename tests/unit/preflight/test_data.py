"""check_data: what `grpo-stream up` refuses in one line before any service starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_stream.config import ConfigError, config_from_dict
from grpo_stream.preflight.data import DataCheckError, check_data


def _gsm(tmp_path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "gsm.parquet"
    rows = [f"{i}+{i}=" for i in range(40)]
    pq.write_table(
        pa.table({"question": rows, "answer": [f"#### {2 * i}" for i in range(40)]}), path
    )
    return path


def test_a_good_dataset_run_passes_and_returns_its_columns(tmp_path: Path) -> None:
    cfg = config_from_dict({"task": {"name": "dataset", "dataset": str(_gsm(tmp_path))}})
    assert check_data(cfg) == ["question", "answer"]


def test_a_missing_field_is_refused(tmp_path: Path) -> None:
    task = {"name": "dataset", "dataset": str(_gsm(tmp_path)), "answer_field": "solution"}
    with pytest.raises(DataCheckError, match=r"task.answer_field: .*columns: question, answer"):
        check_data(config_from_dict({"task": task}))


def test_an_eval_task_overlapping_training_is_refused(tmp_path: Path) -> None:
    task = {"name": "dataset", "dataset": str(_gsm(tmp_path))}
    cfg = config_from_dict({"task": task, "eval": {"every": 5, "task": task, "problems": 4}})
    with pytest.raises(DataCheckError, match=r"eval.task overlaps the training prompts"):
        check_data(cfg)


def test_an_eval_task_of_other_prompts_passes(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    task = {"name": "dataset", "dataset": str(_gsm(tmp_path))}
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"question": ["9*9="], "answer": ["81"]}), other / "t.parquet")
    evals = {"name": "dataset", "dataset": str(other / "t.parquet")}
    check_data(config_from_dict({"task": task, "eval": {"every": 5, "task": evals}}))


def test_eval_without_holdout_or_eval_task_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"set task.holdout"):
        config_from_dict({"eval": {"every": 10}})


def test_a_user_reward_that_does_not_import_is_refused() -> None:
    rewards = [{"name": "python", "import": "no_such_module_q:fn"}]
    with pytest.raises(DataCheckError, match="cannot import no_such_module_q"):
        check_data(config_from_dict({"task": {"rewards": rewards}}))


def test_a_task_its_rewards_cannot_score_is_refused_before_any_service_starts() -> None:
    """The guess task without its environment: exact_match needs reference answers, which
    guess's problems do not have (it used to start and abort after 200 failed groups)."""
    with pytest.raises(DataCheckError) as info:
        check_data(config_from_dict({"task": {"name": "guess"}}))
    message = str(info.value)
    assert message.startswith("reward 'exact_match' cannot score task 'guess': ")
    assert "keys: high, target" in message and "\n" not in message


def test_the_same_task_played_by_its_environment_passes() -> None:
    cfg = config_from_dict(
        {
            "task": {"name": "guess"},
            "env": {"name": "guess"},
            "model": {"name_or_path": "grpo-stream/tiny-guess"},
        }
    )
    assert check_data(cfg) == []


READS_PRODUCT = """
def accuracy(completion, *, prompt, reference):
    return float(completion.strip() == reference["product"])
"""


def test_a_user_reward_that_raises_is_refused_naming_its_file_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_rewards.py").write_text(READS_PRODUCT)
    monkeypatch.chdir(tmp_path)  # user code is found from the working directory
    rewards = [{"name": "my_rewards:accuracy"}]
    with pytest.raises(DataCheckError) as info:
        check_data(config_from_dict({"task": {"rewards": rewards}}))
    message = str(info.value)
    assert message.startswith("reward 'my_rewards:accuracy' cannot score task 'arith': ")
    assert "raised KeyError: 'product' (my_rewards.py:3 in accuracy)" in message
    assert "keys: answer" in message and "\n" not in message


HANGS = """
import time

def slow(completion, **_):
    time.sleep(60)
    return 1.0
"""


def test_a_user_reward_that_hangs_is_refused_after_the_scorers_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "slow_rewards.py").write_text(HANGS)
    monkeypatch.chdir(tmp_path)
    cfg = {"task": {"rewards": [{"name": "slow_rewards:slow"}]}, "scorer": {"timeout_s": 0.5}}
    with pytest.raises(DataCheckError, match=r"'slow_rewards:slow' .*: timeout after 0.5s"):
        check_data(config_from_dict(cfg))


def test_a_user_reward_that_scores_the_sample_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ok_rewards.py").write_text(READS_PRODUCT.replace('"product"', '"answer"'))
    monkeypatch.chdir(tmp_path)
    rewards = [{"name": "ok_rewards:accuracy"}]
    assert check_data(config_from_dict({"task": {"rewards": rewards}})) == []
