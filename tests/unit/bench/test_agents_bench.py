"""bench.agents in its smoke mode: both sides play the shipped tool example, the results
file holds both sides' rates and the ratios computed from them."""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def test_the_smoke_run_measures_both_sides_and_their_ratio(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(REPO))
    bench = importlib.import_module("bench.agents")
    out = tmp_path / "agents.json"
    bench.main(["--smoke", "--out", str(out)])
    result = json.loads(out.read_text())
    inner, outer = result["median"]["in_process"], result["median"]["endpoint"]
    assert inner["episodes"] == outer["episodes"] == 4  # 2 prompts x 2, each side
    assert inner["turns"] >= 4 and outer["turns"] >= 4 and outer["failed"] == 0
    ratio = inner["episodes_per_s"] / outer["episodes_per_s"]
    assert math.isclose(result["time_per_episode_ratio"], ratio)
    assert "training" not in result  # the smoke run trains nothing
    assert result["load_average"]["before"] and result["environment"]["versions"]
