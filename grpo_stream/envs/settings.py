"""Settings of multi-turn episodes (`[env]` in the run config)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

ENV_NAMES = ("none", "guess", "calc")


class EnvSettings(BaseModel):
    """The environment the policy talks to; `none` keeps single-turn tasks (the default)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: str = "none"
    """none (single-turn: the scorer's rewards), guess, calc, or a user class
    `package.module:Class` implementing `grpo_stream.envs.base.Environment`."""
    max_turns: int = Field(8, ge=1, le=256)
    """Policy turns per episode; an episode still running after them is truncated."""
    max_episode_tokens: int = Field(96, ge=2)
    """Tokens after the prompt (policy and environment turns together); a turn that would
    exceed it truncates the episode. Each policy turn samples at most generator.max_tokens."""
    timeout_s: float = Field(5.0, gt=0)
    """Longest one environment call (reset or step) may take; past it the episode fails."""
    memory_limit_mb: int = Field(512, ge=16)
    """Address space an environment worker may grow by after loading."""
    workers: int = Field(1, ge=1, le=64)
    """Environment worker processes per generator."""
    format: str = "{observation}"
    """How an observation becomes the environment's turn text (plain tokenizers), with
    `{observation}` replaced; ignored when task.chat_template is on (the template's user turn
    is rendered instead)."""
    guess_turns: int = Field(4, ge=1)
    """guess: the number must be found within this many guesses for the success reward."""
    guess_shaping: float = Field(0.1, ge=0, le=1)
    """guess: per-turn reward for a guess inside the range the feedback still allows."""

    @property
    def enabled(self) -> bool:
        """Whether tasks run as episodes."""
        return self.name != "none"

    def builtin(self) -> bool:
        """Whether `name` is a built-in environment (or none)."""
        return self.name in ENV_NAMES

    @model_validator(mode="after")
    def _check(self) -> EnvSettings:
        if not self.builtin() and ":" not in self.name:
            raise ValueError(
                f"env.name {self.name!r}: expected one of {', '.join(ENV_NAMES)} "
                "or package.module:Class"
            )
        if "{observation}" not in self.format:
            raise ValueError("env.format must contain {observation}")
        return self


def check_env_config(env: EnvSettings, micro_batch_tokens: int) -> None:
    """Cross-section checks of an episode run (raised as one line naming the setting); both
    engines play episodes (`complete`)."""
    if not env.enabled:
        return
    if micro_batch_tokens <= env.max_episode_tokens:
        raise ValueError(
            f"trainer.micro_batch_tokens ({micro_batch_tokens}) must exceed "
            f"env.max_episode_tokens ({env.max_episode_tokens}) plus the prompt"
        )
