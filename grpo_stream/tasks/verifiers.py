"""verifiers environments (prime-rl's environment library, `verifiers.v1`) as grpo-stream
tasks: the prompts side. The turns side is `grpo_stream.envs.verifiers_adapter`.

A run names a verifiers environment by a factory, `package.module:factory`, a function
with no arguments returning a `verifiers.v1.Env` (e.g. one calling
`vf.load_environment(vf.EnvConfig(...))`), in two settings:

    task.name = "verifiers:package.module:factory"   # prompts: the env's taskset
    env.name = "grpo_stream.envs.verifiers_adapter:VerifiersEnv"   # turns: its run()

Invariants:
- problem i is the taskset's task i (a bounded taskset wraps around; an endless one is
  read lazily, each task once per process); its prompt is the task's system prompt and
  prompt text (plain), or both rendered by the chat template (`task.chat_template`);
- its reference carries the factory and the task's wire data (`TaskData` as JSON), all the
  environment worker needs to rebuild the same `Task` (msgpack-native values only);
- the env declares exactly one agent seat (the policy); anything else is one line at load.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from grpo_stream.config.tasks import VERIFIERS_PREFIX, RewardSpec
from grpo_stream.tasks.base import Problem
from grpo_stream.usercode import UserCodeError, import_object


class VerifiersLoadError(ValueError):
    """The named verifiers environment cannot be used (one line naming the setting)."""


@functools.cache
def load_vf_env(spec: str) -> Any:
    """The `verifiers.v1.Env` built by factory `spec` (`package.module:factory`), once per
    process."""
    setting = f"task.name = {VERIFIERS_PREFIX + spec!r}"
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise VerifiersLoadError(f"{setting}: expected verifiers:package.module:factory")
    try:
        import verifiers.v1 as vf
        from verifiers.v1.configs.agent import agent_config_fields
    except ImportError:
        raise VerifiersLoadError(
            f"{setting} needs the verifiers package (pip install 'grpo-stream[envs]')"
        ) from None
    try:
        factory = import_object(spec, f"{setting} does not load")
    except UserCodeError as exc:
        raise VerifiersLoadError(str(exc)) from None
    try:
        env = factory()
    except Exception as exc:
        cause = f"{type(exc).__name__}: {exc}"
        raise VerifiersLoadError(f"{setting}: the factory raised {cause}") from None
    if not isinstance(env, vf.Env):
        raise VerifiersLoadError(
            f"{setting}: the factory returned {type(env).__name__}, not a verifiers.v1.Env"
        )
    seats = sorted(agent_config_fields(env.config))
    if len(seats) != 1:
        raise VerifiersLoadError(
            f"{setting}: the env declares agents {seats}; grpo-stream drives exactly one "
            "seat, the policy (multi-agent envs are not supported)"
        )
    return env


def rebuild_task(env: Any, data: dict[str, Any]) -> Any:
    """The taskset's `Task` from its wire data (what a reference carries)."""
    task_cls = type(env.taskset).task_type()
    return task_cls(task_cls.data_type().model_validate(data), env.taskset.config.task)


class VerifiersTask:
    """The taskset of a verifiers environment, as a grpo-stream task."""

    def __init__(self, spec: str, tokenizer: Any = None, chat_template: bool = False) -> None:
        self.spec = spec
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.env = load_vf_env(spec)
        taskset = self.env.taskset
        self._tasks: Iterator[Any] = iter(taskset)
        self._seen: list[Any] = []
        if taskset.bounded:
            self._seen = list(self._tasks)
            if not self._seen:
                raise VerifiersLoadError(f"task.name = {self.name!r}: the taskset is empty")

    @property
    def name(self) -> str:
        return VERIFIERS_PREFIX + self.spec

    @property
    def size(self) -> int | None:
        return len(self._seen) if self.env.taskset.bounded else None

    def problem(self, index: int) -> Problem:
        if index < 0:
            raise ValueError(f"problem index must be >= 0, got {index}")
        size = self.size
        position = index % size if size is not None else index
        while len(self._seen) <= position:
            self._seen.append(next(self._tasks))
        task = self._seen[position]
        data = task.data.model_dump(mode="json", exclude_defaults=True)
        return Problem(index, self._prompt(task.data), {"vf_env": self.spec, "vf_task": data})

    def _prompt(self, data: Any) -> str:
        if data.prompt is None:
            raise VerifiersLoadError(
                f"task.name = {self.name!r}: task {data.idx} has no prompt (tasks the user "
                "opens are not supported: the policy speaks first)"
            )
        if not self.chat_template:
            head = f"{data.system_prompt}\n\n" if data.system_prompt else ""
            return head + str(data.prompt_text)
        if not getattr(self.tokenizer, "chat_template", None):
            raise VerifiersLoadError("task.chat_template = true but the tokenizer has none")
        system = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
        turns = [{"role": "user", "content": data.prompt_text}]
        text = self.tokenizer.apply_chat_template(
            system + turns, tokenize=False, add_generation_prompt=True
        )
        return str(text)

    def default_rewards(self) -> list[RewardSpec]:
        """Episodes are rewarded by the env's rubric (its task's @reward hooks and the
        rewards its run() records); this spec is never called for them."""
        return [RewardSpec(name="exact_match", weight=1.0)]
