"""The trainer's policy version as the hub knows it, and staleness: their one owner.

The trainer's version is written only by `observe_trainer` (what its batch requests name)
and `served` (the version it will name next, once a step went out). "Stale" has one formula,
`staleness` / `is_stale`, which the replay buffer, the batch desk, the rollout gate and the
step statistics ask; a rollout counts from its `policy_version`, its oldest token's version
(hub.guard refuses a rollout where it is not). The highest version a trainer can plausibly
name is `plausible_trainer_version`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PolicyVersions:
    """Where the trainer is, and how far behind it a version is."""

    max_staleness: int
    next_version: int = 0
    """The trainer's version at its next batch request."""
    trainer_version: int = 0
    """The version the trainer last named (in Welcome and Status)."""

    def observe_trainer(self, version: int) -> None:
        """The trainer's version, as its batch request names it (versions are unique: a
        resumed trainer publishes above every version it announced before)."""
        self.trainer_version = version
        self.next_version = version

    def served(self, version: int) -> None:
        """A step for the trainer at `version` went out: it asks next at version + 1."""
        self.next_version = version + 1

    def staleness(self, version: int) -> int:
        """How many policy versions `version` is behind the trainer; never negative (a version
        the hub has not yet heard the trainer name is not behind it)."""
        return max(0, self.next_version - version)

    def is_stale(self, version: int) -> bool:
        """True if what `version` generated is too old to train at the trainer's version."""
        return self.staleness(version) > self.max_staleness

    def plausible_trainer_version(self) -> int:
        """The highest version a batch request can name: a trainer resumed from an older
        checkpoint continues `max_staleness + 1` above what it announced
        (`grpo_stream.training.versions.resumed_version`)."""
        return self.next_version + self.max_staleness + 1
