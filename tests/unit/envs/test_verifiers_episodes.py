"""verifiers episodes through the real turn loop: the tiny-guess hf engine samples every
reply, the adapter runs in the sandboxed env workers; trajectories stay token-exact and an
env that raises fails only its episode (NaN, one event)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from grpo_stream.config.envs import ADAPTER_ENV, EnvSettings
from grpo_stream.envs.episodes import Episode, EpisodeRun, run_episodes
from grpo_stream.envs.sandbox import EnvPool
from grpo_stream.envs.turns import TurnFormat
from grpo_stream.sampling import Sampling
from grpo_stream.tasks.verifiers import VerifiersTask

pytestmark = pytest.mark.slow  # each worker imports verifiers (10-20 s on a loaded machine)


@pytest.fixture(scope="module")
def pool() -> Iterator[EnvPool]:
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(Path(__file__).parent))  # before the workers start
        with EnvPool(EnvSettings(name=ADAPTER_ENV, timeout_s=30.0)) as p:
            yield p


def play(engine: Any, pool: EnvPool, spec: str, infos: list[dict[str, Any]]) -> list[Episode]:
    task = VerifiersTask(spec)
    problems = [task.problem(i) for i in range(len(infos))]
    for problem, info in zip(problems, infos, strict=True):
        problem.reference["vf_task"].setdefault("info", {}).update(info)
    settings = EnvSettings(name=ADAPTER_ENV, max_turns=4, max_episode_tokens=64)
    run = EpisodeRun(
        prompts=[p.prompt for p in problems], references=[p.reference for p in problems],
        group_size=1, sampling=Sampling(3, seed=3),
    )  # fmt: skip
    fmt = TurnFormat(engine.tokenizer, chat=False)
    groups = run_episodes(engine, engine.tokenizer, pool, fmt, settings, run)
    return [e for g in groups for e in g]


def test_a_scripted_verifiers_episode_is_sampled_ids_then_its_turns_tokenized(
    engine: Any, pool: EnvPool
) -> None:
    (ep,) = play(engine, pool, "vf_guess:load_scripted", [{}])
    tok = engine.tokenizer
    assert len(ep.turn_starts) == 3 and ep.turn_rewards == [0.0, 0.0, 1.0]
    for k, start in enumerate(ep.turn_starts):
        end = ep.turn_starts[k + 1] if k < 2 else len(ep.token_ids)
        ids, mask = ep.token_ids[start:end], ep.mask[start:end]
        sampled = [t for t, m in zip(ids, mask, strict=True) if m]
        assert tok.decode(sampled, skip_special_tokens=True) == ep.texts[k]
        if k < 2:
            env_ids = [t for t, m in zip(ids, mask, strict=True) if not m]
            assert env_ids == tok(f"t{k + 1}:", add_special_tokens=False)["input_ids"]
    assert ep.error is None and not ep.truncated and ep.reward == 1.0


def test_a_verifiers_env_that_raises_fails_only_its_episode(engine: Any, pool: EnvPool) -> None:
    with capture_logs() as logs:
        bad, good = play(
            engine, pool, "vf_guess:load_environment", [{"raise_at": 1}, {"raise_at": -1}]
        )
    assert math.isnan(bad.reward) and "vf env broke" in (bad.error or "")
    assert good.error is None and math.isfinite(good.reward)
    failed = [e for e in logs if e["event"] == "env.episode_failed"]
    assert len(failed) == 1
