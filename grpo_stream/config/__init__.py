"""Every setting of a run, on the ground floor of the import graph.

One module per section (`trainer`, `algo`, `distill`, `tasks`, `envs`, `evaluator`,
`hardware`, `transport`, `lora`, `cluster`), composed into `RunConfig` (`run`), loaded from
TOML with `--set` overrides (`loading`). Nothing in this package imports a role: every role
imports it.
"""

from grpo_stream.config.loading import config_from_dict, load_config, parse_override
from grpo_stream.config.run import (
    DEFAULT_MODEL,
    ConfigError,
    GeneratorSettings,
    HubSettings,
    ModelSettings,
    ReplaySettings,
    RunConfig,
    RunSettings,
    ScorerSettings,
)
from grpo_stream.config.tasks import TaskSettings
from grpo_stream.config.trainer import TrainerSettings

__all__ = [
    "DEFAULT_MODEL",
    "ConfigError",
    "GeneratorSettings",
    "HubSettings",
    "ModelSettings",
    "ReplaySettings",
    "RunConfig",
    "RunSettings",
    "ScorerSettings",
    "TaskSettings",
    "TrainerSettings",
    "config_from_dict",
    "load_config",
    "parse_override",
]
