"""A verifiers taskset as a grpo-stream task; bad names and envs are one line naming
task.name; the run config pairs verifiers tasks with the adapter environment."""

from __future__ import annotations

import re

import pytest

from grpo_stream.config import RunConfig
from grpo_stream.config.envs import ADAPTER_ENV
from grpo_stream.tasks import TaskSettings, make_task
from grpo_stream.tasks.verifiers import VerifiersLoadError, VerifiersTask


def test_problems_are_the_tasksets_tasks_with_their_wire_data() -> None:
    task = make_task(TaskSettings(name="verifiers:vf_guess:load_environment"))
    assert task.name == "verifiers:vf_guess:load_environment" and task.size is None
    problem = task.problem(4)
    assert problem.prompt == "guess 1-16:"
    assert problem.reference["vf_env"] == "vf_guess:load_environment"
    assert problem.reference["vf_task"]["idx"] == 4
    assert task.problem(4) == problem  # deterministic


def test_a_bounded_taskset_wraps_around() -> None:
    task = VerifiersTask("vf_single:load_single")
    assert task.size == 3
    assert task.problem(4).prompt == task.problem(1).prompt == "2+1="


@pytest.mark.parametrize(
    ("spec", "cause"),
    [
        ("no_such_module_xyz:load", "does not load: cannot import no_such_module_xyz: No module"),
        ("vf_guess:nope", "does not load"),
        ("vf_guess:load_broken", "the factory raised OSError: no such dataset"),
        ("vf_guess:feedback", "the factory raised TypeError"),
        ("vf_guess:load_two_seats", "the env declares agents ['judge', 'player']"),
        ("vf_guess", "expected verifiers:package.module:factory"),
    ],
)
def test_a_bad_environment_is_one_line_naming_task_name(spec: str, cause: str) -> None:
    with pytest.raises(VerifiersLoadError) as info:
        VerifiersTask(spec)
    message = str(info.value)
    assert message.startswith(f"task.name = 'verifiers:{spec}'") and cause in message
    assert "\n" not in message


def test_a_verifiers_task_needs_the_adapter_env_and_the_adapter_a_verifiers_task() -> None:
    with pytest.raises(ValueError, match=re.escape(f"needs env.name = {ADAPTER_ENV!r}")):
        RunConfig.model_validate({"task": {"name": "verifiers:vf_guess:load_environment"}})
    with pytest.raises(ValueError, match=r"plays verifiers tasks: task.name must be"):
        RunConfig.model_validate({"env": {"name": ADAPTER_ENV}})
    cfg = RunConfig.model_validate(
        {"task": {"name": "verifiers:vf_guess:load_environment"}, "env": {"name": ADAPTER_ENV}}
    )
    assert cfg.env.enabled


def test_task_name_without_a_factory_is_refused_by_the_settings() -> None:
    with pytest.raises(ValueError, match=re.escape("verifiers:package.module:factory")):
        TaskSettings(name="verifiers:only_a_module")
