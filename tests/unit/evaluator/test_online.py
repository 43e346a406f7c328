"""OnlineEval: one evaluation pass with the hf engine, written to eval.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_stream.config import config_from_dict
from grpo_stream.evaluator.online import OnlineEval
from grpo_stream.rundir.evals import EVAL_FILE, read_eval
from grpo_stream.sampling import Sampling
from grpo_stream.tasks import held_out


@pytest.fixture(scope="module")
def engine() -> object:
    from grpo_stream.config import ModelSettings
    from grpo_stream.config.transport import SecuritySettings, TransportSettings
    from grpo_stream.engines.hf import HFEngine

    return HFEngine.from_settings(ModelSettings(), TransportSettings(), SecuritySettings(), "cpu")


def _cfg(tmp_path: Path, **ev: object) -> object:
    return config_from_dict(
        {
            "run": {"run_dir": str(tmp_path)},
            "task": {"holdout": 0.2},
            "eval": {"every": 5, "problems": 8, "k": 4, **ev},
        }
    )


def test_eval_problems_are_held_out_and_fixed(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    a, b = OnlineEval.build(cfg), OnlineEval.build(cfg)  # type: ignore[arg-type]
    assert [p.prompt for p in a.problems] == [p.prompt for p in b.problems]
    assert all(held_out(p.prompt, 0.2) for p in a.problems)


def test_a_pass_writes_one_row_with_the_eval_keys(tmp_path: Path, engine: object) -> None:
    online = OnlineEval.build(_cfg(tmp_path))  # type: ignore[arg-type]
    row = online.run(engine, step=0)  # type: ignore[arg-type]
    assert read_eval(tmp_path) == [json.loads(json.dumps(row))]
    for key in ("eval/pass@1", "eval/pass@k", "eval/reward"):
        assert 0.0 <= row[key] <= 1.0
    assert row["eval/pass@k"] >= row["eval/pass@1"]
    assert row["eval/k"] == 4 and row["eval/problems"] == 8
    online.run(engine, step=5)  # type: ignore[arg-type]
    assert [r["step"] for r in read_eval(tmp_path)] == [0, 5]
    assert (tmp_path / EVAL_FILE).exists()


def test_greedy_top_p_decodes_the_argmax_whatever_the_seed(engine: object) -> None:
    import torch

    from grpo_stream.evaluation import GREEDY_TOP_P

    prompts = ["3+4=", "12+9=", "7+7="]
    runs = [
        engine.generate(prompts, 2, Sampling(4, top_p=GREEDY_TOP_P, seed=s))  # type: ignore[attr-defined]
        for s in (1, 2)
    ]
    texts = [[c.text for g in run for c in g.completions] for run in runs]
    assert texts[0] == texts[1]
    model, tok = engine.model, engine.tokenizer  # type: ignore[attr-defined]
    for group in runs[0]:
        with torch.no_grad():
            logits = model(torch.tensor([group.prompt_ids])).logits[0, -1]
        assert group.completions[0].token_ids[0] == int(logits.argmax())
    assert tok is not None


def test_greedy_needs_k_1() -> None:
    with pytest.raises(ValueError, match=r"eval.k = 1"):
        config_from_dict({"task": {"holdout": 0.1}, "eval": {"every": 1, "greedy": True}})
