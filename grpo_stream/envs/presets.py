"""`grpo-stream up --task NAME`: the settings that make a built-in task run as shipped.

Each preset is a list of `section.key=value` overrides applied before the config file's and
`--set`'s (so both still win). `arith` is the default run and changes nothing; `calc-tools`
is calc played by a user agent calling a JSON function through the generator's endpoint
(`grpo_stream.agents.calc`).
"""

from __future__ import annotations

PRESETS: dict[str, list[str]] = {
    "arith": [],
    "guess": [
        'task.name="guess"',
        'env.name="guess"',
        'model.name_or_path="grpo-stream/tiny-guess"',
        "generator.max_tokens=3",
        "env.max_turns=4",
        "env.guess_turns=4",
        "env.max_episode_tokens=64",
        'algo.returns="per_turn"',
        "trainer.lr=5e-4",
        "hub.groups_per_step=8",
        "run.max_steps=90",
    ],
    "calc": [
        'task.name="calc"',
        'env.name="calc"',
        'model.name_or_path="grpo-stream/tiny-calc"',
        "generator.max_tokens=20",
        "env.max_turns=3",
        "env.max_episode_tokens=64",
        "trainer.lr=5e-4",
        "hub.groups_per_step=8",
        "run.max_steps=120",
    ],
    "calc-tools": [
        'task.name="calc"',
        'env.agent="grpo_stream.agents.calc:calc_agent"',
        'model.name_or_path="grpo-stream/tiny-tools"',
        "generator.max_tokens=80",
        "env.max_turns=3",
        "env.max_episode_tokens=128",
        "trainer.lr=5e-4",
        "hub.groups_per_step=8",
        "run.max_steps=120",
    ],
}


def task_preset(name: str) -> list[str]:
    """The overrides of `--task name`; ValueError naming the known tasks otherwise."""
    if name not in PRESETS:
        raise ValueError(f"--task {name!r}: expected one of {', '.join(PRESETS)}")
    return list(PRESETS[name])
