"""Dispatch by shares: deficit first, never beyond credits, no idle capacity."""

from __future__ import annotations

from collections import Counter

from grpo_stream.hub.dispatch import allocate
from grpo_stream.hub.registry import Peer


def peer(name: str, credits: int) -> Peer:
    return Peer("generator", name, name.encode(), "h", 1, 0, {}, credits=credits)


def test_the_generator_below_its_share_is_served_first() -> None:
    fast, slow = peer("fast", 8), peer("slow", 8)
    got = allocate([fast, slow], {"fast": 0.75, "slow": 0.25}, Counter(fast=30, slow=2), 8)
    assert got["slow"] >= 6  # slow is owed 0.25 * 40 - 2 = 8


def test_over_a_run_dispatch_follows_the_shares() -> None:
    fast, slow = peer("fast", 100), peer("slow", 100)
    sent: Counter[str] = Counter()
    for _ in range(200):
        for p, n in allocate([fast, slow], {"fast": 0.75, "slow": 0.25}, sent, 4).items():
            sent[p] += n
    assert abs(sent["fast"] / sent["slow"] - 3.0) < 0.1


def test_never_more_than_credits_and_leftover_goes_to_whoever_has_credits() -> None:
    fast, slow = peer("fast", 10), peer("slow", 1)
    got = allocate([fast, slow], {"fast": 0.1, "slow": 0.9}, Counter(), 8)
    assert got["slow"] == 1 and got["fast"] == 7


def test_nothing_available_gives_nothing() -> None:
    assert allocate([peer("a", 5)], {"a": 1.0}, Counter(), 0) == {}
