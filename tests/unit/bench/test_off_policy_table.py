"""bench/off_policy_table.py: standard errors over seeds, the ratio's delta-method s.e., paired
differences from behaviour, and the summary's files and last line."""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO))
    return importlib.import_module("bench.off_policy_table")


def test_mean_se_is_the_sample_sd_over_root_n(table: ModuleType) -> None:
    mean, se = table.mean_se([1.0, 2.0, 4.0, 5.0])
    assert mean == 3.0
    assert se == pytest.approx(math.sqrt(((4 + 1 + 1 + 4) / 3) / 4))
    assert math.isnan(table.mean_se([1.0])[1])


def test_ratio_se_pairs_seeds_by_the_delta_method(table: ModuleType) -> None:
    on = {0: 0.10, 1: 0.14, 2: 0.12, 3: 0.08}
    cell = {0: 0.09, 1: 0.12, 2: 0.13, 3: 0.06}
    r, se = table.ratio_se(cell, on)
    mc, mo = np.mean(list(cell.values())), np.mean(list(on.values()))
    assert r == pytest.approx(mc / mo)
    # Taylor expansion of mean(c) / mean(o) around the means: the residuals c_k - R o_k
    resid = [cell[k] - r * on[k] for k in on]
    assert se == pytest.approx(np.std(resid, ddof=1) / 2 / mo)
    # a cell proportional to the reference seed by seed has no ratio error
    assert table.ratio_se({k: 0.5 * v for k, v in on.items()}, on)[1] == pytest.approx(0.0)


def test_ratio_se_of_other_seeds_adds_both_errors(table: ModuleType) -> None:
    on, cell = {0: 0.1, 1: 0.2}, {2: 0.1, 3: 0.3}
    r, se = table.ratio_se(cell, on)
    sc, so = table.mean_se([0.1, 0.3])[1], table.mean_se([0.1, 0.2])[1]
    assert r == pytest.approx(0.2 / 0.15)
    assert se == pytest.approx(math.sqrt(sc**2 + r**2 * so**2) / 0.15)


def test_paired_difference_uses_only_the_common_seeds(table: ModuleType) -> None:
    d, se, n = table.paired({0: 0.3, 1: 0.5, 2: 0.9}, {0: 0.1, 1: 0.4, 3: 0.0})
    assert (n, d) == (2, pytest.approx(0.15))
    assert se == pytest.approx(table.mean_se([0.2, 0.1])[1])


def test_summary_writes_per_seed_gains_paired_differences_and_the_last_line(
    table: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("bench.common.RESULTS_DIR", tmp_path)
    finals = {(0, "tis"): [0.4, 0.5], (4, "behaviour"): [0.35, 0.45], (4, "tis"): [0.37, 0.46]}
    runs = [
        {"staleness": s, "mode": m, "reuse": 1, "seed": k, "final_reward": f}
        for (s, m), values in finals.items()
        for k, f in enumerate(values)
    ]
    table.summarise(runs, 0.3, "t", {})
    out = capsys.readouterr().out.strip().splitlines()
    # gains: on-policy 0.1, 0.2 (mean 0.15); tis 0.07, 0.16 (mean 0.115): ratio 0.7667
    assert out[-1] == "staleness4 best/onpolicy gain ratio: 0.767"
    data = json.loads((tmp_path / "t.json").read_text())
    tis = data["ratios"]["s4_r1"]["tis"]
    assert tis["gains"] == {"0": pytest.approx(0.07), "1": pytest.approx(0.16)}
    assert tis["minus_behaviour"]["gain"] == pytest.approx(0.015)
    assert tis["minus_behaviour"]["seeds"] == 2
    md = (tmp_path / "t.md").read_text()
    assert "| 4 | 1 | tis | 0: +0.070, 1: +0.160 |" in md
    assert (tmp_path / "t.png").exists()
