"""reasoning_gym:<dataset>: reasoning-gym's generators as a task, parameters passed through."""

from __future__ import annotations

import pytest

from grpo_stream.tasks import TaskDataError, TaskSettings, make_task, validate_task

CHAIN = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def test_problems_are_reasoning_gyms_entries() -> None:
    import reasoning_gym

    task = make_task(TaskSettings(name="reasoning_gym:chain_sum", params=CHAIN, size=50, seed=3))
    entries = {e["question"]: e["answer"] for e in reasoning_gym.create_dataset(
        "chain_sum", seed=3, size=50, **CHAIN)}  # fmt: skip
    for i in range(60):
        p = task.problem(i)
        assert entries[p.prompt] == p.reference["answer"]
    assert task.size == 50


def test_parameters_reach_the_generator() -> None:
    task = make_task(TaskSettings(name="reasoning_gym:chain_sum", params=CHAIN))
    for i in range(20):
        meta = task.problem(i).reference["entry"]["metadata"]
        assert meta["num_terms"] == 2 and meta["num_digits"] == 1


def test_each_epoch_visits_every_entry_once() -> None:
    task = make_task(TaskSettings(name="reasoning_gym:chain_sum", params=CHAIN, size=8))
    first = [task.problem(i).reference["entry"]["metadata"]["source_index"] for i in range(8)]
    assert sorted(first) == list(range(8))


def test_prompt_template_sees_the_metadata() -> None:
    settings = TaskSettings(
        name="reasoning_gym:chain_sum", params=CHAIN, prompt_template="{expression}="
    )
    p = make_task(settings).problem(0)
    assert p.prompt == p.reference["entry"]["metadata"]["expression"] + "="


def test_default_reward_is_reasoning_gyms_scorer() -> None:
    task = make_task(TaskSettings(name="reasoning_gym:products"))
    assert [s.name for s in task.default_rewards()] == ["reasoning_gym"]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"name": "reasoning_gym:no_such_set"}, "reasoning-gym has no dataset 'no_such_set'"),
        ({"name": "reasoning_gym:chain_sum", "params": {"bogus": 1}}, "task.params for"),
        (
            {"name": "reasoning_gym:chain_sum", "prompt_template": "{nope}"},
            "task.prompt_template: .* no field 'nope'",
        ),
    ],
)
def test_bad_input_is_one_line(settings: dict[str, object], message: str) -> None:
    with pytest.raises(TaskDataError, match=message) as info:
        validate_task(TaskSettings.model_validate(settings))
    assert "\n" not in str(info.value)


def test_name_must_be_known() -> None:
    with pytest.raises(ValueError, match="reasoning_gym:<dataset>"):
        TaskSettings(name="gsm8k")
