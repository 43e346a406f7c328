"""metrics.jsonl: a row lacking a REQUIRED column is refused; the hub's columns come from the
typed StepStats (so none can go missing on the way)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from grpo_stream.protocols.make_golden import step_stats_example
from grpo_stream.training.metrics import REQUIRED, MetricsWriter, hub_columns, read_metrics


def test_a_row_lacking_a_required_column_is_refused(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path)
    row = dict.fromkeys(REQUIRED, 0.0)
    del row["staleness_mean"]
    with pytest.raises(ValueError, match="staleness_mean"):
        writer.write(row)
    writer.close()
    assert read_metrics(tmp_path) == []


def test_hub_columns_are_the_step_stats_fields() -> None:
    stats = step_stats_example()
    cols = hub_columns(stats)
    assert (cols["reward_mean"], cols["staleness_mean"]) == (stats.reward_mean, 1.0)
    assert (cols["groups_trained"], cols["groups_stale"]) == (12, 1)
    assert cols["gen_tokens_per_s"] == {"gen-0": 1234.5, "gen-1": 987.25}
    assert cols["tokens_per_s"] == 1234.5 + 987.25  # all generators together
    assert cols["scorer_cpu_s_per_completion"] == 0.00125


def test_generator_rates_that_do_not_match_their_names_are_an_error() -> None:
    stats = replace(step_stats_example(), gen_tokens_per_s=[1.0])
    with pytest.raises(ValueError):
        hub_columns(stats)


def test_read_metrics_returns_the_object_rows_only(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n[2]\n3\n{"step": 4}\n{"step": 5, "lo')
    assert read_metrics(tmp_path) == [{"step": 1}, {"step": 4}]
