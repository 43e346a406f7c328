"""Reward functions: pure, safe verifiers `fn(completion, *, prompt, reference, **params)`.

`load_reward(spec)` returns a built-in (exact_match, math_verify, format, length_penalty,
countdown) or a user `package.module:function` with the spec's params bound; the scorer's
sandbox calls it in worker processes, so nothing here holds state.
"""

from __future__ import annotations

from grpo_stream.rewards.errors import RewardLoadError
from grpo_stream.rewards.registry import (
    BUILTIN,
    RewardFn,
    combine,
    load_reward,
    reward_specs,
)

__all__ = ["BUILTIN", "RewardFn", "RewardLoadError", "combine", "load_reward", "reward_specs"]
