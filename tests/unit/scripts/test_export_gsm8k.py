"""scripts/export_gsm8k.py writes a file the example's dataset task reads as it is configured."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from grpo_stream.config import load_config
from grpo_stream.tasks import make_task, validate_task

ROOT = Path(__file__).resolve().parents[3]


def _script():
    spec = importlib.util.spec_from_file_location("export_gsm8k", ROOT / "scripts/export_gsm8k.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_exported_file_is_what_the_example_config_reads(tmp_path):
    rows = [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
        {"question": "What is 6 times 7?", "answer": "#### 42"},
    ]
    out = tmp_path / "data" / "gsm8k_train.jsonl"
    assert _script().write_rows(rows, out) == 2
    example = load_config(ROOT / "examples" / "qwen-gsm8k.toml", [f'task.dataset="{out}"'])
    # the example's columns and answer rule, without its chat template (Qwen's tokenizer is
    # not on this machine) and without its held-out part (two rows)
    settings = example.task.model_copy(
        update={"chat_template": False, "system_prompt": None, "holdout": 0.0}
    )
    assert {"question", "answer"} <= set(validate_task(settings))
    task = make_task(settings)
    answers = sorted(task.problem(i).reference["answer"] for i in range(2))
    assert answers == ["42", "7"]
