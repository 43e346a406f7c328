"""The ranks of a context group: where each stands, and the batch its leader shares."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from grpo_stream.protocols.codec import encode

sys.path.insert(0, str(Path(__file__).parent))
import context_ranks as ranks

pytestmark = pytest.mark.slow  # reads the two spawned ranks' results (conftest.py)


def test_the_first_rank_of_a_group_leads_it(group_results: list[dict[str, Any]]) -> None:
    assert [r["context"] for r in group_results] == [
        {"place": 0, "leader": 0, "leads": True},
        {"place": 1, "leader": 0, "leads": False},
    ]


def test_every_rank_gets_the_leaders_batch_byte_for_byte(
    group_results: list[dict[str, Any]],
) -> None:
    want = [bytes(f) for f in encode(ranks.make_batch())]
    for rank in group_results:
        assert [bytes(f) for f in encode(rank["shared"])] == want


def test_a_leader_that_stops_stops_its_group(group_results: list[dict[str, Any]]) -> None:
    assert [r["after_stop"] for r in group_results] == [None, None]
