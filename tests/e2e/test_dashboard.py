"""The dashboard in a real headless Chromium: the page of a live `up` run shows its four
services and its curves grow as steps arrive, pushed without a reload, and says how the run
ended when it ends; the finished run's page renders from its run directory alone."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from grpo_stream.training.samples import read_samples

from .browser import chromium, save_screenshot, wait_for
from .conftest import Run, metrics

SERVICES = {"grouper", "trainer", "generator", "scorer"}


def _url(path: Path, proc: subprocess.Popen[bytes] | None = None, timeout_s: float = 90) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process exited with code {proc.returncode}")
        time.sleep(0.2)
    raise AssertionError(f"{path} was not written within {timeout_s:.0f}s")


def _append_eval(run_dir: Path) -> None:
    """An eval.jsonl row as the evaluator writes it (the default run has no evaluator)."""
    row = {"step": 12, "policy_version": 12, "eval/pass@1": 0.625, "eval/pass@k": 0.75,
           "eval/k": 4, "eval/reward": 0.625, "eval/problems": 16}  # fmt: skip
    with (run_dir / "eval.jsonl").open("a") as fh:
        fh.write(json.dumps(row) + "\n")


def _completions(driver: Any) -> list[list[str]]:
    """The completions table's cells, row by row (newest first)."""
    return list(
        driver.execute_script(
            "return [...document.querySelectorAll('#completions tr.completion')]"
            ".map(tr => [...tr.cells].map(td => td.textContent))"
        )
    )


def _bars(driver: Any, chart: str) -> tuple[list[Any], list[Any]]:
    """(x, y) of the chart's first trace as plotly.js holds them."""
    xy = driver.execute_script(
        f"const t = document.getElementById('{chart}').data[0]; return [[...t.x], [...t.y]]"
    )
    return list(xy[0]), list(xy[1])


def _nodes(driver: Any) -> dict[str, str]:
    """service -> state of the graph's nodes (the last node of each service wins)."""
    found = driver.execute_script(
        "return [...document.querySelectorAll('#graph g.node')]"
        ".map(g => [g.dataset.service, g.dataset.state])"
    )
    return dict(found)


def _points(driver: Any, chart: str) -> int:
    return int(driver.execute_script(f"return document.getElementById('{chart}').dataset.points"))


def _plotted(driver: Any, chart: str) -> int:
    """Points of the chart's first trace as plotly.js holds them."""
    script = (
        f"const d = document.getElementById('{chart}'); return d.data ? d.data[0].x.length : -1"
    )
    return int(driver.execute_script(script))


@pytest.mark.slow
def test_a_live_run_and_then_its_finished_page_in_a_real_browser(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    steps = 12  # paced (trainer.throttle_s) so that the page sees them arrive
    run = Run(
        run_dir,
        steps,
        *("--set", "dashboard.port=0", "--set", "trainer.throttle_s=0.3"),
        *("--set", "run.log_completions=3"),  # the trainer's samples, every 3 steps
    )
    try:
        url = _url(run_dir / "dashboard.url", run.proc)
        with chromium() as driver:
            driver.get(url)
            wait_for(driver, "the four services running",
                     lambda d: _nodes(d) == dict.fromkeys(SERVICES, "running"), 90)  # fmt: skip
            first = wait_for(driver, "a first step on the reward chart",
                             lambda d: max(_plotted(d, "chart-reward"), 0), 90)  # fmt: skip
            assert first < steps, "the run ended before the page saw its steps arrive"
            grown = min(first + 3, steps)
            wait_for(driver, "the curves growing as steps arrive",
                     lambda d: _plotted(d, "chart-reward") >= grown, 60)  # fmt: skip
            assert driver.find_element("id", "phase").text == "live"
            wait_for(driver, "the trainer's samples in the completions table while live",
                     lambda d: _completions(d), 60)  # fmt: skip
            wait_for(driver, "the generator's weights version beside the trainer's",
                     lambda d: _points(d, "chart-versions") >= 1, 30)  # fmt: skip
            save_screenshot(driver, "dashboard-live.png")
            assert run.finish(timeout=180) == 0, run.output()[-2000:]
            # the page open when the run ends says how it ended, not "live" beside a lost link
            wait_for(
                driver,
                "the ended run's phase on the live page",
                lambda d: d.find_element("id", "phase").text == "completed",
                30,
            )
            wait_for(
                driver,
                "the page saying it is finished",
                lambda d: d.find_element("id", "connection").text.startswith("finished"),
                30,
            )
    finally:
        run.kill()
    assert len(metrics(run_dir)) == steps
    (run_dir / "dashboard.url").unlink(missing_ok=True)  # the live run's
    server = subprocess.Popen(
        [sys.executable, "-m", "grpo_stream.cli.main", "dashboard", str(run_dir), "--port", "0"],
        stderr=subprocess.DEVNULL,
    )
    try:
        url = _url(run_dir / "dashboard.url", server)
        with chromium() as driver:
            driver.get(url)
            wait_for(driver, "the finished run's phase",
                     lambda d: d.find_element("id", "phase").text == "completed", 30)  # fmt: skip
            wait_for(driver, "every step on the reward chart",
                     lambda d: _plotted(d, "chart-reward") == steps, 30)  # fmt: skip
            assert _nodes(driver) == dict.fromkeys(SERVICES, "stopped")
            assert _points(driver, "chart-grad") == steps and _points(driver, "chart-kl") == steps
            assert driver.find_element("id", "step").get_attribute("data-step") == str(steps)
            _check_staleness(driver, metrics(run_dir))
            _check_reward_cost(driver, metrics(run_dir))
            _check_completions(driver, read_samples(run_dir))
            save_screenshot(driver, "dashboard-finished.png")
            _append_eval(run_dir)  # a panel fills from a file that appears later too
            wait_for(driver, "the evaluation table",
                     lambda d: "0.625" in d.find_element("id", "evals").text, 30)  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=30)


def _check_staleness(driver: Any, rows: list[dict[str, Any]]) -> None:
    """The histogram's bars are the steps' `staleness_counts` added up, versions 0, 1, ..."""
    per_step = [r["staleness_counts"] for r in rows]
    assert all(per_step), "a step without its sequences' staleness"
    total = [sum(c[i] for c in per_step if i < len(c)) for i in range(max(map(len, per_step)))]
    assert _bars(driver, "chart-staleness") == (list(range(len(total))), total)


def _check_reward_cost(driver: Any, rows: list[dict[str, Any]]) -> None:
    """The reward-cost chart is the steps' scorer CPU per completion, in milliseconds."""
    cost = [(r["step"], r["scorer_cpu_s_per_completion"]) for r in rows]
    known = [(step, 1000 * s) for step, s in cost if s is not None]
    assert known, "no step knew its scorers' CPU per completion"
    x, y = _bars(driver, "chart-reward-cost")
    assert x == [step for step, _ in known] and y == pytest.approx([ms for _, ms in known])


def _check_completions(driver: Any, logged: list[dict[str, Any]]) -> None:
    """The table shows the newest of the trainer's samples, newest first, as logged."""
    assert logged, "the run logged no completions (run.log_completions)"
    shown = _completions(driver)
    newest = logged[::-1][: len(shown)]
    assert len(shown) == min(len(logged), 20)
    for cells, sample in zip(shown, newest, strict=True):
        step, version, reward, advantage, tokens, prompt, completion = cells
        assert (step, version, tokens) == (str(sample["step"]), f"v{sample['version']}",
                                           str(sample["tokens"]))  # fmt: skip
        assert (prompt, completion) == (sample["prompt"], sample["completion"])
        assert float(reward) == pytest.approx(sample["reward"], abs=5e-3)
        assert float(advantage) == pytest.approx(sample["advantage"], rel=5e-3, abs=5e-3)
