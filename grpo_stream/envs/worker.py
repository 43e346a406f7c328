"""The worker side of the environment sandbox: a process holding the environments of the
episodes assigned to it, answering reset/step calls over a pipe of msgpack messages.

Runs in a sandbox worker (`grpo_stream.sandbox.worker.serve`): forked from the fork server,
it ignores SIGINT, dies with its parent, and caps its address space after loading. Every
call is answered by exactly one reply, in order:
`["ok", key, observation, reward, done]` or `["error", key, cause]`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from grpo_stream.config.envs import EnvSettings
from grpo_stream.envs.base import Environment, Step
from grpo_stream.envs.registry import env_factory
from grpo_stream.sandbox.worker import Handler, pack, short

Reply = list[Any]


def check_step(result: object) -> str | None:
    """Why `result` is not a valid `Step` (None when it is)."""
    if not isinstance(result, Step):
        return f"step returned {type(result).__name__}, not a Step"
    if not isinstance(result.observation, str):
        return f"step returned a {type(result.observation).__name__} observation, not text"
    if not isinstance(result.reward, numbers.Real) or isinstance(result.reward, bool):
        return f"step returned a {type(result.reward).__name__} reward, not a number"
    if not math.isfinite(float(result.reward)):
        return f"step returned non-finite reward {result.reward}"
    if not isinstance(result.done, bool):
        return f"step returned done of type {type(result.done).__name__}, not bool"
    return None


class Held:
    """The environments of this worker's live episodes, by episode key."""

    def __init__(self, factory: Callable[[], Environment]) -> None:
        self.factory = factory
        self.envs: dict[int, Environment] = {}

    def reset(self, key: int, prompt: str, reference: dict[str, Any]) -> Reply:
        try:
            env = self.factory()
            env.reset(prompt, reference)
        except MemoryError:
            return ["error", key, "memory limit"]
        except BaseException as exc:  # an environment may raise anything
            return ["error", key, short(f"reset raised {type(exc).__name__}: {exc}")]
        self.envs[key] = env
        return ["ok", key, "", 0.0, False]

    def step(self, key: int, action: str) -> Reply:
        env = self.envs.get(key)
        if env is None:
            return ["error", key, "no live environment for this episode (its worker was replaced)"]
        bad: str | None
        try:
            result = env.step(action)
        except MemoryError:
            result, bad = None, "memory limit"
        except BaseException as exc:  # an environment may raise anything
            result, bad = None, short(f"step raised {type(exc).__name__}: {exc}")
        else:
            bad = check_step(result)
        if bad is not None or not isinstance(result, Step):
            self.envs.pop(key, None)
            return ["error", key, bad]
        if result.done:
            self.envs.pop(key, None)
        return ["ok", key, result.observation, float(result.reward), result.done]


def load(conn: Connection, settings: dict[str, Any]) -> Handler:
    """An environment worker's code (`grpo_stream.sandbox.worker.serve` calls it): the
    environment class, and the handler that answers calls."""
    held = Held(env_factory(EnvSettings.model_validate(settings)))

    def handle(message: list[Any]) -> None:
        if message[0] == "drop":
            for key in message[1]:
                held.envs.pop(int(key), None)
            return
        for call in message[1]:  # ["reset", key, prompt, reference] | ["step", key, action]
            reply = held.reset(*call[1:]) if call[0] == "reset" else held.step(*call[1:])
            conn.send_bytes(pack(reply))

    return handle
