"""bench/inflight.py: how a completion's version runs become per-version token counts and
how rounds pool, without an engine."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def inflight(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO))
    return importlib.import_module("bench.inflight")


def test_runs_become_token_counts_per_version(inflight: ModuleType) -> None:
    assert inflight.token_versions([(0, 3), (5, 4), (9, 3)], 12, 3) == {3: 8, 4: 4}


def test_a_completion_without_tokens_counts_as_the_version_it_started_under(
    inflight: ModuleType,
) -> None:
    assert inflight.token_versions([], 0, 7) == {7: 0}  # not version 0


def test_rounds_pool_into_one_row(inflight: ModuleType) -> None:
    a = inflight.Tally(steps=2, seconds=4.0, idle_s=[0.5], staleness=[1, 0], token_age=2,
                       token_count=4, mixed=1)  # fmt: skip
    b = inflight.Tally(steps=4, seconds=4.0, idle_s=[0.1], staleness=[0, 0], token_count=4)
    a.add(b)
    row = a.row()
    assert row["steps_per_s"] == pytest.approx(0.75)
    assert row["idle_per_update_s"] == pytest.approx(0.3)
    assert row["token_staleness_mean"] == pytest.approx(0.25)
    assert row["mixed_version_groups"] == pytest.approx(0.25)
