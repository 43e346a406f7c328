"""`name = "python"` user rewards by import path, and reasoning-gym's own scorer as a reward."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_stream.config.tasks import RewardSpec
from grpo_stream.rewards import RewardLoadError, load_reward
from grpo_stream.rewards.sandbox import RewardPool
from grpo_stream.tasks import TaskSettings, make_task

HERE = Path(__file__).parent


def test_python_reward_is_imported_and_gets_its_params(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    spec = RewardSpec.model_validate(
        {"name": "python", "import": "bad_rewards:scaled_length", "params": {"scale": 0.25}}
    )
    assert load_reward(spec)("abcd", prompt="p", reference={}) == 1.0


def test_python_reward_with_an_unknown_module_fails_at_load() -> None:
    spec = RewardSpec.model_validate({"name": "python", "import": "no_such_pkg_x:score"})
    with pytest.raises(RewardLoadError, match="cannot import no_such_pkg_x"):
        load_reward(spec)


def test_import_goes_only_with_python() -> None:
    with pytest.raises(ValueError, match="import"):
        RewardSpec.model_validate({"name": "python"})
    with pytest.raises(ValueError, match="import"):
        RewardSpec.model_validate({"name": "exact_match", "import": "a:b"})


def test_python_spec_round_trips_through_its_dump() -> None:
    spec = RewardSpec.model_validate({"name": "python", "import": "m:f"})
    assert RewardSpec.model_validate(spec.model_dump(mode="json", by_alias=True)) == spec
    assert RewardSpec.model_validate(spec.model_dump()) == spec


GYM = TaskSettings(
    name="reasoning_gym:chain_sum",
    params={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
)


def test_reasoning_gym_reward_is_the_datasets_scorer() -> None:
    import reasoning_gym

    problem = make_task(GYM).problem(3)
    fn = load_reward(RewardSpec(name="reasoning_gym"))
    entry = problem.reference["entry"]
    scorer = reasoning_gym.get_score_answer_fn("chain_sum")
    for answer in (problem.reference["answer"], "nonsense", "-999"):
        assert fn(answer, prompt=problem.prompt, reference=problem.reference) == scorer(
            answer, entry
        )
    assert fn(f" {problem.reference['answer']}\n", prompt="", reference=problem.reference) == 1.0


@pytest.mark.slow
def test_reasoning_gym_reward_scores_in_the_sandbox() -> None:
    problem = make_task(GYM).problem(0)
    right, wrong = problem.reference["answer"], "no idea"
    with RewardPool([RewardSpec(name="reasoning_gym")], 1, 10.0, 512) as pool:
        result = pool.score(problem.prompt, [right, wrong], problem.reference)
    assert result.rewards.tolist() == [1.0, 0.0]


def test_reasoning_gym_reward_refuses_a_reference_without_an_entry() -> None:
    fn = load_reward(RewardSpec(name="reasoning_gym"))
    with pytest.raises(ValueError, match="reasoning_gym:<dataset>"):
        fn("3", prompt="", reference={"answer": "3"})


def test_reasoning_gym_is_imported_when_the_reward_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    # a worker loads its rewards before it serves: the seconds-long import must happen then,
    # not inside the first call's timeout
    import sys

    monkeypatch.delitem(sys.modules, "reasoning_gym")
    load_reward(RewardSpec(name="reasoning_gym"))
    assert "reasoning_gym" in sys.modules
