"""What `up` starts on this machine: scorers for single-turn runs and for episodes a scorer
replays; none for episodes no scorer can replay (an agent's: their rewards are the
generator's word, and the hub takes their Rollouts' rewards itself)."""

from __future__ import annotations

from grpo_stream.config import config_from_dict
from grpo_stream.launch.up import local_specs


def services(overrides: dict[str, object]) -> list[str]:
    return [s.service for s in local_specs(config_from_dict(overrides), "tcp://h:1", False)]


def test_single_turn_runs_start_their_scorers() -> None:
    assert services({"scorer": {"count": 2}}).count("scorer") == 2


def test_episodes_a_scorer_replays_start_their_scorers() -> None:
    started = services(
        {"task": {"name": "guess"}, "env": {"name": "guess"}, "scorer": {"count": 2}}
    )
    assert started.count("scorer") == 2 and {"trainer", "generator"} <= set(started)


def test_an_agents_episodes_start_no_scorer() -> None:
    agent = {"agent": "grpo_stream.agents.calc:calc_agent"}
    started = services({"task": {"name": "calc"}, "env": agent, "scorer": {"count": 2}})
    assert "scorer" not in started and {"trainer", "generator"} <= set(started)


def test_distillation_runs_start_their_teachers_and_others_none() -> None:
    assert "teacher" not in services({})
    taught = services({"algo": {"distill": {"teacher": "x"}}, "teacher": {"count": 2}})
    assert taught.count("teacher") == 2 and taught.count("scorer") == 1


def test_up_starts_the_trainer_then_generators_scorers_the_evaluator_and_teachers() -> None:
    cfg = config_from_dict(
        {
            "generator": {"count": 2},
            "scorer": {"count": 2},
            "task": {"holdout": 0.1},
            "eval": {"every": 10},
            "algo": {"distill": {"teacher": "grpo-stream/tiny-arith"}},
            "teacher": {"count": 2},
        }
    )
    specs = local_specs(cfg, "tcp://h:1", False)
    assert [s.instance for s in specs] == [
        "trainer-0",
        *["generator-0", "generator-1", "scorer-0", "scorer-1"],
        *["evaluator-0", "teacher-0", "teacher-1"],
    ]
    for s in specs:
        assert s.argv[s.argv.index("run") + 1 :][:3] == [s.service, "--instance", s.instance]
        assert s.restarts_left == cfg.run.restarts
