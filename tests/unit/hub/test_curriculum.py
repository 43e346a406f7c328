"""The hub's curriculum: pass rates per prompt or family, prompts let out by their expected
signal with an exploration floor, dispatch through the ledger, checkpointed with the hub."""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from grpo_stream.config import load_config
from grpo_stream.config.curriculum import CurriculumSettings
from grpo_stream.envs.local import LocalEnvs
from grpo_stream.envs.registry import env_factory
from grpo_stream.envs.replay import replay
from grpo_stream.hub.curriculum import Curriculum, expected_signal, problem_key
from grpo_stream.hub.ledger import Ledger
from grpo_stream.protocols.episodes import EpisodeScoreRequest
from grpo_stream.services.grouper import Grouper
from grpo_stream.tasks import Task, TaskSettings, make_task
from grpo_stream.transport.sockets import close_context

sys.path.insert(0, str(Path(__file__).parent))
from test_transcript import HUB_SETS, episode_group

G = 4
LEVELS = ("easy", "medium", "hard")


def mixed_task(tmp_path: Path, rows: int = 30, family: bool = True) -> Task:
    """A local dataset, a third of each level, the level as its family column."""
    path = tmp_path / "mixed.jsonl"
    path.write_text(
        "".join(
            json.dumps({"question": f"{i}+{i}=", "answer": str(2 * i), "level": LEVELS[i % 3]})
            + "\n"
            for i in range(rows)
        )
    )
    settings = TaskSettings(
        name="dataset", dataset=str(path), family_field="level" if family else None
    )
    return make_task(settings)


def per_prompt(tmp_path: Path, rows: int = 30, **settings: Any) -> tuple[Task, Curriculum]:
    """The mixed task without families (each prompt its own key) and its curriculum."""
    task = mixed_task(tmp_path, rows=rows, family=False)
    return task, Curriculum(CurriculumSettings(enabled=True, **settings), task, G, seed=0)


def rewards_of(level: str) -> np.ndarray:
    """A group as each level scores: all pass, half pass, none pass."""
    passed = {"easy": G, "medium": G // 2, "hard": 0}[level]
    return np.array([1.0] * passed + [0.0] * (G - passed), dtype=np.float32)


def test_expected_signal_is_the_chance_the_group_is_not_all_equal() -> None:
    # from the definition: enumerate the 2^G pass/fail outcomes of a group of G
    for p in (0.0, 0.1, 0.5, 0.9, 1.0):
        mixed = sum(
            math.prod(p if x else 1 - p for x in outcome)
            for outcome in itertools.product([0, 1], repeat=G)
            if 0 < sum(outcome) < G
        )
        assert expected_signal(p, G) == pytest.approx(mixed, abs=1e-12)


def test_a_prompt_not_seen_yet_always_goes_out(tmp_path: Path) -> None:
    cur = Curriculum(CurriculumSettings(enabled=True), mixed_task(tmp_path), G, seed=0)
    assert [cur.next_index(i) for i in range(30)] == list(range(30))


def test_prompts_go_out_in_proportion_to_their_expected_signal_with_the_floor(
    tmp_path: Path,
) -> None:
    task = mixed_task(tmp_path)
    floor = 0.1
    cur = Curriculum(CurriculumSettings(enabled=True, floor=floor), task, G, seed=0)
    for i in range(30):  # one group of each prompt: easy all pass, hard none, medium half
        cur.observe(i, rewards_of(task.problem(i).family or ""))
    taken: list[str] = []
    cursor = 30
    while len(taken) < 3000:
        index = cur.next_index(cursor)
        taken.append(task.problem(index).family or "")
        cursor = index + 1
    # the stream is a third of each level; a(easy) = a(hard) = floor, a(medium) = s(1/2)/s(1/2)
    total = floor + floor + 1.0
    shares = {level: taken.count(level) / len(taken) for level in LEVELS}
    se = math.sqrt((1 / 12) * (11 / 12) / len(taken))  # binomial s.e. of the easy share
    assert shares["easy"] == pytest.approx(floor / total, abs=4 * se)
    assert shares["hard"] == pytest.approx(floor / total, abs=4 * se)
    assert shares["medium"] == pytest.approx(1.0 / total, abs=6 * se)


def test_the_pass_rate_averages_its_first_window_groups_then_moves_by_one_over_window(
    tmp_path: Path,
) -> None:
    task, cur = per_prompt(tmp_path, window=2)
    key = problem_key(task.problem(0))
    cur.observe(0, np.array([1, 1, 1, 1], np.float32))
    cur.observe(0, np.array([0, 0, 0, 0], np.float32))
    assert cur.pass_rate(key) == pytest.approx(0.5)
    cur.observe(0, np.array([1, 1, 1, 0], np.float32))
    assert cur.pass_rate(key) == pytest.approx(0.5 + (0.75 - 0.5) / 2)


def test_a_pass_is_a_reward_at_least_pass_reward_and_failed_rewards_do_not_count(
    tmp_path: Path,
) -> None:
    task, cur = per_prompt(tmp_path, pass_reward=0.5)
    key = problem_key(task.problem(1))
    cur.observe(1, np.array([0.5, 0.2, math.nan, math.nan], np.float32))
    assert cur.pass_rate(key) == pytest.approx(0.5)
    cur.observe(2, np.array([math.nan] * G, np.float32))  # every reward failed: no rate
    assert cur.pass_rate(problem_key(task.problem(2))) is None


def test_without_a_family_the_same_prompt_seen_again_shares_its_rate(tmp_path: Path) -> None:
    task, cur = per_prompt(tmp_path, rows=6)
    cur.observe(0, rewards_of("easy"))
    again = next(i for i in range(6, 12) if task.problem(i).prompt == task.problem(0).prompt)
    assert cur.accept_probability(problem_key(task.problem(again))) == cur.settings.floor
    others = [i for i in range(6, 12) if i != again]
    assert all(cur.accept_probability(problem_key(task.problem(i))) == 1.0 for i in others)


def test_the_table_forgets_the_least_recently_seen_key_first(tmp_path: Path) -> None:
    task, cur = per_prompt(tmp_path, max_keys=2)
    for gid in (0, 1, 0, 2):  # 0 seen again after 1: 1 is the least recent
        cur.observe(gid, rewards_of("easy"))
    assert list(cur.rates) == [problem_key(task.problem(i)) for i in (0, 2)]


def test_the_ledger_passes_over_what_the_curriculum_skips_and_keeps_its_accounts(
    tmp_path: Path,
) -> None:
    task = mixed_task(tmp_path)
    ledger = Ledger(groups_per_step=64, max_staleness=4, lease_timeout_s=10.0)
    ledger.source = Curriculum(CurriculumSettings(enabled=True), task, G, seed=0)
    for i in range(30):  # one group of each prompt
        ledger.source.observe(i, rewards_of(task.problem(i).family or ""))
    taken = ledger.take_for_generation("gen", 40, now=0.0)
    assert taken is not None
    ids = sorted(taken[0].group_ids)
    summary = ledger.summary()
    assert summary["dispatched"] == 40 and ids[-1] + 1 == ledger.cursor
    assert summary["skipped"] == ledger.cursor - 40 > 0  # every index below: taken or skipped
    assert sum(task.problem(i).family == "medium" for i in ids) > 40 / 2
    ledger.check_invariant()


def test_a_restarted_hub_keeps_its_pass_rates(tmp_path: Path) -> None:
    task_path = tmp_path / "data"
    task_path.mkdir()
    mixed_task(task_path)
    sets = [
        f'run.run_dir="{tmp_path / "run"}"',
        'task.name="dataset"',
        f'task.dataset="{task_path / "mixed.jsonl"}"',
        'task.family_field="level"',
        "hub.curriculum.enabled=true",
        f"generator.group_size={G}",
    ]
    cfg = load_config(None, sets)
    hub = Grouper(cfg)
    try:
        hub.ledger.source.observe(0, rewards_of(hub.task.problem(0).family or ""))
        before = hub.ledger.source.state()
        hub._checkpoint()
    finally:
        hub.server.close()
        close_context(hub.ctx)
    again = Grouper(cfg, resume=True)
    try:
        assert isinstance(again.ledger.source, Curriculum)
        assert again.ledger.source.state() == before and before["rates"]
    finally:
        again.server.close()
        close_context(again.ctx)


def test_the_hub_learns_a_pass_rate_from_each_scored_group(tmp_path: Path) -> None:
    """Through the hub's intake: a guess episode group, rewarded by a scorer's replay, with
    one of its two episodes at reward >= 1 gives its prompt a pass rate of 1/2."""
    sets = [f'run.run_dir="{tmp_path}"', *HUB_SETS, "hub.curriculum.enabled=true"]
    hub = Grouper(load_config(None, sets))
    try:
        gen, scorer, rollout, sent = episode_group(hub)
        hub.intake.on_rollout(gen, rollout)
        hub._dispatch(0.0)
        (request,) = [s for s in sent if isinstance(s, EpisodeScoreRequest)]
        hub.intake.on_episode_scored(scorer, replay(LocalEnvs(env_factory(hub.cfg.env)), request))
        source = hub.ledger.source
        assert isinstance(source, Curriculum)
        key = problem_key(hub.task.problem(rollout.group_id))
        assert source.pass_rate(key) == pytest.approx(0.5)
    finally:
        hub.server.close()
        close_context(hub.ctx)
