"""How many reward worker processes a scorer runs: `scorer.workers`, a number or "auto".

auto: `up` gives each scorer it starts on its machine an equal share of the cores that the
torch services it starts there leave (`spare_share`), passed in GRPO_STREAM_SCORER_WORKERS; a
scorer started otherwise (`grpo-stream run scorer`, another host of a cluster) takes the cores
it may run on. Either way at least one worker, and at most `scorer.groups_per_request`: a
worker scores one group at a time and a scorer holds at most that many. A run with a learned
reward (a reward model, a judge) runs one worker with auto: each worker loads its own copy
of the model (set a number to run more).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

ENV_WORKERS = "GRPO_STREAM_SCORER_WORKERS"

ScorerWorkers = int | Literal["auto"]
LEARNED = ("reward_model", "judge")
"""Reward names that load a model in each worker."""


def spare_share(cores: int, torch_threads: int, scorers: int) -> int:
    """Workers for each of `scorers` scorers on a machine of `cores` cores whose torch
    services run `torch_threads` threads in all (at least one)."""
    return max(1, (cores - torch_threads) // max(1, scorers))


def model_copies(setting: ScorerWorkers) -> int:
    """Workers of a scorer whose rewards load a model: each holds a copy."""
    return 1 if setting == "auto" else setting


def resolve_workers(
    setting: ScorerWorkers,
    groups_per_request: int,
    environ: Mapping[str, str],
    cores: int,
    learned: bool = False,
) -> int:
    """The workers a starting scorer runs: the setting, or for auto what `up` planned in
    `environ`, else `cores`; auto stays within 1..groups_per_request, and is 1 with a
    `learned` reward."""
    if setting != "auto" or learned:
        return model_copies(setting)
    planned = environ.get(ENV_WORKERS, "")
    wanted = int(planned) if planned.isdigit() else cores
    return max(1, min(wanted, groups_per_request))
