"""Engines that take prompts one request at a time and hand back each group when it is done
(the vllm engine): what the generator's streaming loop needs from them.

Importing this module imports neither torch nor vLLM.
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from typing import Protocol, runtime_checkable

from grpo_stream.sampling import GroupSample, Sampling


class EngineFailed(RuntimeError):
    """The engine cannot go on (its inference process died, or it could not load a version
    and stays paused): the generator exits and `up` restarts it."""


@runtime_checkable
class StreamingEngine(Protocol):
    """Per-prompt requests, groups as they finish, versions applied in the background."""

    @property
    def version(self) -> int:
        """The weights version new requests run with."""
        ...

    @property
    def running(self) -> int:
        """Requests submitted and not finished."""
        ...

    def encode(self, prompts: list[str]) -> list[list[int]]:
        """Token ids of each prompt, as the trainer tokenizes them."""
        ...

    def submit(
        self, key: Hashable, prompt_ids: list[int], group_size: int, sampling: Sampling
    ) -> None:
        """Start sampling `group_size` completions of `prompt_ids` now."""
        ...

    def take_finished(self, timeout_s: float = 0.0) -> list[tuple[Hashable, GroupSample, float]]:
        """(key, group, seconds since submission) of every group done by now, waiting up to
        `timeout_s` for the first; raises EngineFailed when the engine cannot go on."""
        ...

    def abort(self, keys: set[Hashable]) -> int:
        """Drop the requests of `keys`: their groups never come back."""
        ...

    def fetch_in_background(self, address: str) -> bool:
        """Fetch and apply the newest version on a thread (False: one is pending)."""
        ...

    def take_fetched(self) -> int | None:
        """The version the background update applied (None: not yet); re-raises its error."""
        ...


def seeds(seed: int | None, count: int) -> list[int | None]:
    """Per-prompt request seeds derived from one seed, in prompt order (None: unseeded)."""
    if seed is None:
        return [None] * count
    rng = random.Random(seed)
    return [rng.getrandbits(31) for _ in range(count)]


def group_seed(run_seed: int, group_id: int) -> int:
    """The request seed of one group: fixed by the run's seed and the group's id, so a group
    samples the same completions however the hub batched it (or re-dispatched it)."""
    return random.Random(run_seed * 1_000_003 + group_id).getrandbits(31)
