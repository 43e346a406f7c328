"""Settings of multi-turn episodes (`[env]` in the run config)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from grpo_stream.config.tasks import VERIFIERS_PREFIX

ADAPTER_ENV = "grpo_stream.envs.verifiers_adapter:VerifiersEnv"
"""The env.name that plays verifiers episodes."""

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
    agent: str | None = None
    """An agent written as user code, `package.module:function`: an async function
    `fn(client, task) -> float` given a client of the generator's OpenAI-compatible endpoint
    and the task row `{"prompt", "reference"}`, returning the episode's reward. Each episode
    is one call, run in the agent sandbox (env.workers processes, env.memory_limit_mb,
    env.agent_timeout_s, env.agent_cpu_s); env.name must then be "none"."""
    agent_client: Literal["openai", "endpoint"] = "openai"
    """What the agent is given: an `openai.AsyncOpenAI` pointed at its episode's endpoint,
    or a `grpo_stream.agents.client.Endpoint` (base_url, api_key, model) for any client."""
    agent_timeout_s: float = Field(60.0, gt=0)
    """Longest an agent may run for one episode, not counting the time its requests wait
    for the model; past it the episode fails."""
    agent_cpu_s: float = Field(30.0, gt=0)
    """CPU seconds an agent worker may use per episode of a batch (its RLIMIT_CPU for the
    batch is this times the episodes it runs); past it the worker is stopped by the kernel
    and its episodes fail."""
    endpoint_host: str = "127.0.0.1"
    """Where the generator's OpenAI-compatible endpoint listens (agents run beside it;
    every episode's URL carries a secret, so only its agent can extend it)."""
    endpoint_port: int = Field(0, ge=0, le=65535)
    """Its port; 0 picks a free one."""
    batch_wait_s: float = Field(0.05, ge=0, le=10)
    """How long the endpoint waits for more agents' requests (while they keep coming) before
    it samples the requests it holds as one batch; it samples at once when every running
    agent waits for the model."""
    alarm_failed_share: float = Field(0.25, gt=0, le=1)
    """The hub raises `env.failure_alarm` (an error event) when at least this share of the
    last env.alarm_window episodes failed (an environment or agent raised, hung, exceeded a
    limit)."""
    alarm_window: int = Field(64, ge=1)
    """Episodes the failure alarm looks back over."""
    alarm_abort: bool = False
    """Stop the run when the failure alarm fires (else it only reports)."""

    @property
    def enabled(self) -> bool:
        """Whether tasks run as episodes (an environment, or an agent)."""
        return self.name != "none" or self.agent is not None

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
        if self.agent is not None:
            module, _, attr = self.agent.partition(":")
            if not module or not attr:
                raise ValueError(f"env.agent {self.agent!r}: expected package.module:function")
            if self.name != "none":
                raise ValueError(
                    f"env.agent and env.name = {self.name!r} exclude each other: an agent "
                    'plays its own environment (set env.name = "none")'
                )
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


def check_verifiers_config(task_name: str, env_name: str) -> None:
    """A verifiers task plays through the adapter environment, and only it does."""
    if task_name.startswith(VERIFIERS_PREFIX) and env_name != ADAPTER_ENV:
        raise ValueError(
            f"task.name = {task_name!r} needs env.name = {ADAPTER_ENV!r} (got {env_name!r})"
        )
    if env_name == ADAPTER_ENV and not task_name.startswith(VERIFIERS_PREFIX):
        raise ValueError(
            f"env.name = {ADAPTER_ENV!r} plays verifiers tasks: task.name must be "
            f"'verifiers:package.module:factory' (got {task_name!r})"
        )
