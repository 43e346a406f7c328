"""math: rows from a local file, reshuffled per epoch, wrapped by index."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from grpo_stream.models.loading import load_tokenizer
from grpo_stream.tasks import TaskDataError, TaskSettings, make_task

HAS_PYARROW = importlib.util.find_spec("pyarrow") is not None


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
    task = make_task(TaskSettings(name="math", path=path, question_field="problem",
                                  answer_field="solution"))  # fmt: skip
    assert task.problem(0).prompt == "1+1?"


def test_missing_field_names_the_setting(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.jsonl", [{"problem": "1+1?", "answer": "2"}])
    with pytest.raises(TaskDataError, match="'question'"):
        make_task(TaskSettings(name="math", path=path))


def test_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TaskDataError, match=r"task\.path"):
        make_task(TaskSettings(name="math"))
    with pytest.raises(TaskDataError, match="no such file"):
        make_task(TaskSettings(name="math", path=tmp_path / "absent.jsonl"))


@pytest.mark.skipif(HAS_PYARROW, reason="pyarrow is installed")
def test_parquet_without_pyarrow_says_what_to_install(tmp_path: Path) -> None:
    path = tmp_path / "p.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(TaskDataError, match="pip install pyarrow"):
        make_task(TaskSettings(name="math", path=path))


@pytest.mark.skipif(not HAS_PYARROW, reason="needs pyarrow")
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
