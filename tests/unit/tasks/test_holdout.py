"""task.holdout: training and evaluation parts split by prompt hash, never overlapping."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_stream.tasks import TaskSettings, held_out, make_eval_task, make_task


@pytest.mark.parametrize(
    "settings",
    [
        TaskSettings(holdout=0.2),  # arith: only 441 distinct prompts, all seen in training
        TaskSettings(name="countdown", holdout=0.2),
        TaskSettings(name="reasoning_gym:chain_sum", holdout=0.2, size=300),
    ],
    ids=["arith", "countdown", "reasoning_gym"],
)
def test_eval_prompts_never_appear_in_training(settings: TaskSettings) -> None:
    train_task, eval_task = make_task(settings), make_eval_task(settings)
    train = {train_task.problem(i).prompt for i in range(3000)}
    evals = {eval_task.problem(i).prompt for i in range(64)}
    assert evals and train
    assert not train & evals


def test_a_finite_dataset_splits_its_rows(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [f"{i}+{i}=" for i in range(200)]
    pq.write_table(pa.table({"question": rows, "answer": ["x"] * 200}), tmp_path / "d.parquet")
    settings = TaskSettings(name="dataset", dataset=str(tmp_path / "d.parquet"), holdout=0.25)
    train_task, eval_task = make_task(settings), make_eval_task(settings)
    train = {train_task.problem(i).prompt for i in range(1000)}
    evals = {eval_task.problem(i).prompt for i in range(200)}
    assert train | evals == set(rows)
    assert not train & evals
    assert evals == {r for r in rows if held_out(r, 0.25)}


def test_the_held_out_fraction_is_about_the_setting() -> None:
    prompts = [f"{i}*{i}=" for i in range(20_000)]
    share = sum(held_out(p, 0.1) for p in prompts) / len(prompts)
    assert 0.09 < share < 0.11


def test_both_parts_are_pure_functions_of_the_index() -> None:
    settings = TaskSettings(holdout=0.3, seed=5)
    a, b = make_task(settings), make_task(settings)
    assert [a.problem(i) for i in range(50)] == [b.problem(i) for i in range(50)]
    ea, eb = make_eval_task(settings), make_eval_task(settings)
    assert ea.problem(9) == eb.problem(9)  # b computed index 9 first, a after 0..8
    assert [ea.problem(i) for i in range(10)] == [eb.problem(i) for i in range(10)]


def test_eval_part_without_holdout_is_refused() -> None:
    with pytest.raises(ValueError, match=r"task.holdout"):
        make_eval_task(TaskSettings())


def test_both_parts_keep_the_problems_family(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [f"{i}+{i}=" for i in range(50)]
    levels = [f"l{i % 3}" for i in range(50)]
    table = pa.table({"question": rows, "answer": ["x"] * 50, "level": levels})
    pq.write_table(table, tmp_path / "d.parquet")
    settings = TaskSettings(
        name="dataset", dataset=str(tmp_path / "d.parquet"), holdout=0.25, family_field="level"
    )
    for task in (make_task(settings), make_eval_task(settings)):
        for i in range(10):
            p = task.problem(i)
            assert p.family == f"l{int(p.prompt.split('+')[0]) % 3}"
