"""reasoning_gym:<dataset>: the procedural generators of the reasoning-gym package.

Invariants: the generator is built once, from (dataset, task.params, task.seed, task.size),
so entry j is fixed by the settings; the stream visits the `size` entries once per epoch in an
order shuffled by (seed, epoch); a problem's reference holds the entry itself (question, answer,
metadata, made msgpack-native), which is what reasoning-gym's own scorer reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from grpo_stream.config.tasks import GYM_PREFIX, RewardSpec, TaskSettings
from grpo_stream.tasks.base import Problem
from grpo_stream.tasks.dataset import (
    TaskDataError,
    epoch_order,
    fill_template,
    render_prompt,
    template_fields,
)


def _native(entry: dict[str, Any]) -> dict[str, Any]:
    """The entry with tuples as lists and anything exotic as its string (msgpack-native)."""
    native: dict[str, Any] = json.loads(json.dumps(entry, default=str))
    return native


@dataclass
class ReasoningGymTask:
    """`size` entries of one reasoning-gym dataset, reshuffled every epoch."""

    settings: TaskSettings
    tokenizer: Any = None
    name: str = field(init=False)
    size: int | None = field(init=False)
    generator: Any = field(init=False)

    def __post_init__(self) -> None:
        self.name = self.settings.name
        self.size = self.settings.size
        self.generator = build_generator(self.settings)
        if self.settings.prompt_template is not None:
            fields = self.template_row(0)
            missing = [f for f in template_fields(self.settings.prompt_template) if f not in fields]
            if missing:
                raise TaskDataError(
                    f"task.prompt_template: {self.name} entries have no field {missing[0]!r}; "
                    f"fields: {', '.join(fields)}"
                )

    def entry(self, index: int) -> dict[str, Any]:
        if index < 0:
            raise ValueError(f"problem index must be >= 0, got {index}")
        epoch, pos = divmod(index, self.settings.size)
        entry: dict[str, Any] = self.generator[
            int(epoch_order(self.settings.seed, epoch, self.settings.size)[pos])
        ]
        return entry

    def template_row(self, index: int) -> dict[str, Any]:
        """What a prompt template may reference: question, answer and the scalar metadata."""
        entry = self.entry(index)
        row = {
            k: v for k, v in entry.get("metadata", {}).items() if isinstance(v, (str, int, float))
        }
        row.update(question=entry["question"])
        return row

    def problem(self, index: int) -> Problem:
        entry = self.entry(index)
        template = self.settings.prompt_template
        text = (
            entry["question"]
            if template is None
            else fill_template(template, self.template_row(index))
        )
        prompt = render_prompt(str(text), self.settings, self.tokenizer)
        reference = {"answer": str(entry["answer"]), "entry": _native(entry)}
        return Problem(index=index, prompt=prompt, reference=reference)

    def default_rewards(self) -> list[RewardSpec]:
        return [RewardSpec(name="reasoning_gym", weight=1.0)]


def build_generator(settings: TaskSettings) -> Any:
    """reasoning_gym.create_dataset for task.name, with task.params; one-line errors."""
    dataset = settings.name.removeprefix(GYM_PREFIX)
    try:
        import reasoning_gym
    except ImportError:
        raise TaskDataError(
            f"task.name {settings.name!r} needs reasoning-gym: pip install reasoning-gym"
        ) from None
    from reasoning_gym.factory import DATASETS

    if dataset not in DATASETS:
        some = ", ".join(sorted(DATASETS)[:8])
        raise TaskDataError(
            f"task.name {settings.name!r}: reasoning-gym has no dataset {dataset!r} "
            f"({len(DATASETS)} datasets, e.g. {some})"
        )
    try:
        return reasoning_gym.create_dataset(
            dataset, seed=settings.seed, size=settings.size, **settings.params
        )
    except (TypeError, ValueError, AssertionError) as exc:
        raise TaskDataError(f"task.params for {settings.name!r}: {exc}") from None
