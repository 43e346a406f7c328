"""The generator's per-token version runs on the wire (in-flight updates): one run per change
of version across the group's concatenated completions, the oldest as policy_version."""

from __future__ import annotations

import numpy as np

from grpo_stream.sampling import Completion
from grpo_stream.services.rollouts import token_version_runs


def completion(n: int, runs: list[tuple[int, int]]) -> Completion:
    return Completion(token_ids=[1] * n, logprobs=[0.0] * n, text="", truncated=False,
                      version_runs=runs)  # fmt: skip


def test_runs_restart_at_each_completion_and_merge_equal_neighbours() -> None:
    comps = [
        completion(4, [(0, 3), (2, 4)]),
        completion(3, [(0, 4)]),
        completion(5, [(0, 3), (1, 4)]),
    ]
    offsets = np.array([0, 4, 7, 12])
    starts, versions = token_version_runs(comps, offsets, version=9)
    assert starts == [0, 2, 7, 8] and versions == [3, 4, 3, 4]
    assert min(versions) == 3  # the rollout's policy_version: its oldest token's


def test_completions_without_runs_count_as_the_engines_version() -> None:
    comps = [completion(2, []), completion(2, [])]
    assert token_version_runs(comps, np.array([0, 2, 4]), version=6) == ([0], [6])
