"""The ranks of a context group: where each stands, and the batch its leader shares."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from grpo_stream.protocols.codec import encode
from grpo_stream.training.context.groups import context_groups

sys.path.insert(0, str(Path(__file__).parent))
import context_ranks as ranks

slow = pytest.mark.slow  # reads the two spawned ranks' results (conftest.py)


def test_a_world_that_the_degree_does_not_divide_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"context_parallel = 2 needs a multiple of 2 ranks"):
        context_groups(2, 0, 1)  # one process: no group to form


@slow
def test_the_first_rank_of_a_group_leads_it(group_results: list[dict[str, Any]]) -> None:
    assert [r["context"] for r in group_results] == [
        {"place": 0, "leader": 0, "leads": True},
        {"place": 1, "leader": 0, "leads": False},
    ]


@slow
def test_every_rank_gets_the_leaders_batch_byte_for_byte(
    group_results: list[dict[str, Any]],
) -> None:
    want = [bytes(f) for f in encode(ranks.make_batch())]
    for rank in group_results:
        assert [bytes(f) for f in encode(rank["shared"])] == want


@slow
def test_a_leader_that_stops_stops_its_group(group_results: list[dict[str, Any]]) -> None:
    assert [r["after_stop"] for r in group_results] == [None, None]
