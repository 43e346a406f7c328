"""dataset (and its alias math): rows read with `datasets` from local Parquet/JSONL/CSV/Arrow,
reshuffled per epoch, wrapped by index; every bad input is one line naming the setting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from grpo_stream.models.loading import load_tokenizer
from grpo_stream.tasks import TaskDataError, TaskSettings, make_task, validate_task


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def gsm(tmp_path: Path) -> Path:
    rows = [{"question": f"What is {i} + {i}?", "answer": f"{i}+{i}={2 * i}\n#### {2 * i}"}
            for i in range(10)]  # fmt: skip
    return _write(tmp_path / "gsm.jsonl", rows)


def test_size_is_the_row_count_and_defaults_to_math_verify(gsm: Path) -> None:
    task = make_task(TaskSettings(name="math", path=gsm))
    assert task.size == 10
    assert [s.name for s in task.default_rewards()] == ["math_verify"]


def test_gsm8k_answers_keep_what_follows_the_marks(gsm: Path) -> None:
    task = make_task(TaskSettings(name="math", path=gsm))
    for i in range(10):
        p = task.problem(i)
        n = int(p.prompt.split()[2])
        assert p.reference == {"answer": str(2 * n)}


def test_each_epoch_visits_every_row_once_in_a_new_order(gsm: Path) -> None:
    task = make_task(TaskSettings(name="math", path=gsm, seed=1))
    first = [task.problem(i).prompt for i in range(10)]
    second = [task.problem(i).prompt for i in range(10, 20)]
    assert sorted(first) == sorted(second) and len(set(first)) == 10
    assert first != second


def test_problems_are_a_pure_function_of_seed_and_index(gsm: Path) -> None:
    a = make_task(TaskSettings(name="math", path=gsm, seed=2))
    b = make_task(TaskSettings(name="math", path=gsm, seed=2))
    assert [a.problem(i) for i in range(25)] == [b.problem(i) for i in range(25)]
    assert b.problem(23) == a.problem(23)


def test_prompt_template_wraps_the_question(gsm: Path) -> None:
    settings = TaskSettings(name="math", path=gsm, prompt_template="Q: {question}\nA: \\boxed{}")
    prompt = make_task(settings).problem(0).prompt
    assert prompt.startswith("Q: What is") and prompt.endswith("\nA: \\boxed{}")


def test_configured_fields_are_read(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.jsonl", [{"problem": "1+1?", "solution": "2"}])
    task = make_task(TaskSettings(name="math", path=path, prompt_field="problem",
                                  answer_field="solution"))  # fmt: skip
    assert task.problem(0).prompt == "1+1?"


def test_missing_field_names_the_setting(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.jsonl", [{"problem": "1+1?", "answer": "2"}])
    with pytest.raises(TaskDataError, match="'question'"):
        make_task(TaskSettings(name="math", path=path))


def test_family_field_names_each_problems_family(tmp_path: Path) -> None:
    rows = [{"question": f"{i}+1=", "answer": str(i + 1), "level": f"l{i % 2}"} for i in range(4)]
    path = _write(tmp_path / "p.jsonl", rows)
    task = make_task(TaskSettings(name="dataset", dataset=str(path), family_field="level"))
    for i in range(8):
        p = task.problem(i)
        assert p.family == f"l{(int(p.prompt.split('+')[0])) % 2}"
    assert make_task(TaskSettings(name="dataset", dataset=str(path))).problem(0).family is None


def test_a_family_field_that_is_no_column_names_the_setting(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.jsonl", [{"question": "1+1=", "answer": "2"}])
    with pytest.raises(TaskDataError, match=r"task\.family_field: .* no column 'level'"):
        make_task(TaskSettings(name="dataset", dataset=str(path), family_field="level"))


def test_a_family_field_outside_a_dataset_task_is_refused() -> None:
    with pytest.raises(ValueError, match=r"task\.family_field names a column of a dataset"):
        TaskSettings(name="arith", family_field="level")


def test_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TaskDataError, match=r"task\.path"):
        make_task(TaskSettings(name="math"))
    with pytest.raises(TaskDataError, match="no such file"):
        make_task(TaskSettings(name="math", path=tmp_path / "absent.jsonl"))


def test_parquet_rows_are_read(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"question": ["1+1?"], "answer": ["2"]}), path)
    assert make_task(TaskSettings(name="math", path=path)).problem(0).reference == {"answer": "2"}


def test_chat_template_without_tokenizer_is_refused(gsm: Path) -> None:
    task = make_task(TaskSettings(name="math", path=gsm, chat_template=True))
    with pytest.raises(ValueError, match="tokenizer"):
        task.problem(0)


def test_chat_template_wraps_the_prompt_as_a_user_turn(gsm: Path) -> None:
    tok = load_tokenizer("grpo-stream/tiny-arith")
    tok.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    settings = TaskSettings(name="math", path=gsm, chat_template=True)
    prompt = make_task(settings, tokenizer=tok).problem(0).prompt
    assert prompt.startswith("<user>What is") and prompt.endswith("</user><assistant>")


# ---- task.name = "dataset" --------------------------------------------------------------


def _parquet(path: Path, columns: dict[str, list[Any]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)
    return path


@pytest.fixture
def gsm_parquet(tmp_path: Path) -> Path:
    n = 12
    return _parquet(
        tmp_path / "gsm.parquet",
        {
            "problem": [f"What is {i} + 3?" for i in range(n)],
            "solution": [f"{i} plus 3 is {i + 3}.\n#### {i + 3}" for i in range(n)],
            "level": [i % 3 for i in range(n)],
        },
    )


def _ds(source: Path | str, **kw: Any) -> TaskSettings:
    base: dict[str, Any] = {"prompt_field": "problem", "answer_field": "solution"}
    return TaskSettings(name="dataset", dataset=str(source), **{**base, **kw})


def test_answer_regex_keeps_its_first_group(gsm_parquet: Path) -> None:
    task = make_task(_ds(gsm_parquet, answer_regex=r"####\s*(\d+)"))
    for i in range(12):
        p = task.problem(i)
        assert p.reference == {"answer": str(int(p.prompt.split()[2]) + 3)}


def test_without_answer_regex_the_answer_is_the_whole_column(gsm_parquet: Path) -> None:
    p = make_task(_ds(gsm_parquet)).problem(0)
    assert p.reference["answer"].endswith("#### " + str(int(p.prompt.split()[2]) + 3))


def test_prompt_template_fills_any_column(gsm_parquet: Path) -> None:
    task = make_task(_ds(gsm_parquet, prompt_template="[level {level}] {problem} {{x}}"))
    p = task.problem(0)
    n = int(p.prompt.split()[4])
    assert p.prompt == f"[level {n % 3}] What is {n} + 3? {{x}}"


def test_jsonl_csv_and_saved_arrow_give_the_same_problems(tmp_path: Path) -> None:
    import datasets

    rows = {"question": [f"{i}+1=" for i in range(6)], "answer": [str(i + 1) for i in range(6)]}
    table = datasets.Dataset.from_dict(rows)
    table.to_json(tmp_path / "d.jsonl")
    table.to_csv(tmp_path / "d.csv", index=False)
    datasets.DatasetDict({"train": table, "test": table}).save_to_disk(tmp_path / "saved")
    sources = [tmp_path / "d.jsonl", tmp_path / "d.csv", tmp_path / "saved"]
    problems = [
        [make_task(TaskSettings(name="dataset", dataset=str(s))).problem(i) for i in range(8)]
        for s in sources
    ]
    assert problems[0] == problems[1] == problems[2]


def test_a_split_of_a_saved_dataset_is_read(tmp_path: Path) -> None:
    import datasets

    train = datasets.Dataset.from_dict({"question": ["a"], "answer": ["1"]})
    test = datasets.Dataset.from_dict({"question": ["b"], "answer": ["2"]})
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(tmp_path / "s")
    task = make_task(TaskSettings(name="dataset", dataset=str(tmp_path / "s"), split="test"))
    assert task.problem(0).prompt == "b"


def test_a_directory_of_split_files_is_loaded_by_name(tmp_path: Path) -> None:
    root = tmp_path / "hub_like"
    (root / "data").mkdir(parents=True)
    _parquet(root / "data" / "train-00000.parquet", {"question": ["t"], "answer": ["1"]})
    _parquet(root / "data" / "test-00000.parquet", {"question": ["e"], "answer": ["2"]})
    task = make_task(TaskSettings(name="dataset", dataset=str(root), split="test"))
    assert task.problem(0).prompt == "e"


def test_streaming_reads_rows_in_file_order_and_wraps(gsm_parquet: Path) -> None:
    streamed = make_task(_ds(gsm_parquet, streaming=True))
    prompts = [streamed.problem(i).prompt for i in range(14)]
    assert prompts[:12] == [f"What is {i} + 3?" for i in range(12)]
    assert prompts[12:] == prompts[:2]
    assert streamed.problem(3).prompt == "What is 3 + 3?"  # going back re-reads the stream


def test_resumed_task_sees_the_same_problems(gsm_parquet: Path) -> None:
    first = make_task(_ds(gsm_parquet, seed=4))
    seen = [first.problem(i) for i in range(30)]
    resumed = make_task(_ds(gsm_parquet, seed=4))
    assert [resumed.problem(i) for i in range(17, 30)] == seen[17:]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"dataset": "/no/such/file.parquet"}, "task.dataset: no such file or directory"),
        ({"split": "test"}, "task.split 'test': a single file"),
        ({"answer_field": "answer"}, "task.answer_field: .* no column 'answer'; columns: problem"),
        ({"prompt_field": "question"}, "task.prompt_field: .* no column 'question'"),
        ({"prompt_template": "Q: {quest}"}, "task.prompt_template: .* no column 'quest'"),
    ],
)
def test_bad_input_is_one_line_naming_the_setting(
    gsm_parquet: Path, settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(TaskDataError, match=message) as info:
        validate_task(_ds(settings.pop("dataset", gsm_parquet), **settings))
    assert "\n" not in str(info.value)


def test_missing_column_lists_the_columns(gsm_parquet: Path) -> None:
    with pytest.raises(TaskDataError, match="columns: problem, solution, level"):
        validate_task(_ds(gsm_parquet, answer_field="ans"))


def test_unknown_split_of_a_saved_dataset_lists_the_splits(tmp_path: Path) -> None:
    import datasets

    table = datasets.Dataset.from_dict({"question": ["a"], "answer": ["1"]})
    datasets.DatasetDict({"train": table}).save_to_disk(tmp_path / "s")
    with pytest.raises(TaskDataError, match=r"'validation': not a split .*splits: train"):
        validate_task(TaskSettings(name="dataset", dataset=str(tmp_path / "s"), split="validation"))


def test_empty_dataset_is_refused(tmp_path: Path) -> None:
    path = _parquet(tmp_path / "e.parquet", {"question": [], "answer": []})
    with pytest.raises(TaskDataError, match="has no rows"):
        validate_task(TaskSettings(name="dataset", dataset=str(path)))


def test_an_answer_the_regex_does_not_match_names_the_problem(gsm_parquet: Path) -> None:
    task = make_task(_ds(gsm_parquet, answer_regex=r"ANSWER: (\d+)"))
    with pytest.raises(TaskDataError, match=r"task.answer_regex .* problem 5"):
        task.problem(5)


def test_dataset_needs_a_source() -> None:
    with pytest.raises(TaskDataError, match=r"task.dataset"):
        validate_task(TaskSettings(name="dataset"))


def test_validate_returns_the_columns(gsm_parquet: Path) -> None:
    assert validate_task(_ds(gsm_parquet)) == ["problem", "solution", "level"]


def test_system_prompt_needs_the_chat_template() -> None:
    with pytest.raises(ValueError, match=r"system_prompt needs task.chat_template"):
        TaskSettings(name="dataset", dataset="x", system_prompt="be brief")


def test_system_prompt_is_a_system_turn(gsm_parquet: Path) -> None:
    tok = load_tokenizer("grpo-stream/tiny-arith")
    tok.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    settings = _ds(gsm_parquet, chat_template=True, system_prompt="Be brief.")
    prompt = make_task(settings, tokenizer=tok).problem(0).prompt
    assert prompt.startswith("<system>Be brief.<user>What is")
