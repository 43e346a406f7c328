"""The evaluator service: which versions it evaluates, and that `up` starts it only on demand."""

from __future__ import annotations

from grpo_stream.config import config_from_dict
from grpo_stream.launch.up import local_specs
from grpo_stream.services.evaluator import next_due


def test_next_due_is_the_next_multiple_of_every() -> None:
    assert [next_due(v, 5) for v in (0, 1, 4, 5, 9, 10)] == [5, 5, 5, 10, 10, 15]


def test_up_starts_an_evaluator_only_when_eval_every_is_set() -> None:
    off = config_from_dict({})
    on = config_from_dict({"task": {"holdout": 0.1}, "eval": {"every": 10}})
    assert "evaluator" not in [s.service for s in local_specs(off, "tcp://h:1", False)]
    specs = [s for s in local_specs(on, "tcp://h:1", False) if s.service == "evaluator"]
    assert [s.instance for s in specs] == ["evaluator-0"]
    assert specs[0].argv[specs[0].argv.index("run") + 1] == "evaluator"
