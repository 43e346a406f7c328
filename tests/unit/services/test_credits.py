"""A generator's credits follow its engine: a fixed prompts_per_request wins; an engine with a
capacity starts at capacity / G prompts and grows as long-tailed groups leave it part-empty;
a batch engine asks for the largest lease the hub sends."""

from __future__ import annotations

from grpo_stream.config import config_from_dict
from grpo_stream.services.credits import CreditWindow, credit_window


class Engine:
    """The engine's side of the boundary: sequences it runs at once for a completion length."""

    def __init__(self, seqs: int) -> None:
        self.seqs = seqs
        self.asked: list[int] = []

    def capacity(self, max_tokens: int) -> int:
        self.asked.append(max_tokens)
        return self.seqs


def test_a_set_prompts_per_request_is_the_window_whatever_the_engine() -> None:
    cfg = config_from_dict({"generator": {"prompts_per_request": 5, "group_size": 8}})
    window = credit_window(cfg, Engine(256))
    assert window.start == 5 and window.asked == 10
    assert [window.done([1, 64, 1, 1, 1, 1, 1, 1]) for _ in range(3)] == [1, 1, 1]


def test_an_engine_with_a_capacity_starts_with_its_sequences_over_the_group_size() -> None:
    cfg = config_from_dict({"generator": {"group_size": 8, "max_tokens": 32}})
    engine = Engine(128)
    window = credit_window(cfg, engine)
    assert window.start == 16 and engine.asked == [32]


def test_a_batch_engine_asks_for_the_largest_lease() -> None:
    ahead = {"hub": {"groups_per_step": 16, "max_refill_ratio": 2.0, "refill_ahead": True}}
    assert credit_window(config_from_dict(ahead), object()).start == 48  # 16 x (1 + 2)
    plain = {"hub": {"groups_per_step": 16, "refill_ahead": False}}
    assert credit_window(config_from_dict(plain), object()).start == 16


def test_groups_of_equal_lengths_keep_the_window() -> None:
    window = CreditWindow(16, capacity=128, group_size=8)
    assert [window.done([10] * 8) for _ in range(5)] == [1] * 5  # one credit per group back


def test_long_tailed_groups_grow_the_window_to_keep_the_engine_full() -> None:
    window = CreditWindow(16, capacity=128, group_size=8)
    # a group's slots were a quarter used until its longest completion ended
    assert window.done([32, 32, 0, 0, 0, 0, 0, 0]) == 1 + 2 * 64 - 32  # 128 / (8 x 1/4) = 64
    assert window.occupancy() == 0.25 and window.asked == 2 * 64


def test_the_window_never_shrinks_nor_passes_the_capacity_in_prompts() -> None:
    window = CreditWindow(16, capacity=128, group_size=8)
    for _ in range(64):  # one completion of each group ran, the others stopped at once
        window.done([100, 0, 0, 0, 0, 0, 0, 0])
    assert window.asked == 2 * 128  # capacity prompts (occupancy 1 / G), twice over
    for _ in range(64):
        assert window.done([10] * 8) == 1  # back to full groups: kept, not given back


def test_a_rejoin_resets_the_window_to_what_the_session_asks_again() -> None:
    window = CreditWindow(16, capacity=128, group_size=8)
    window.done([32, 8, 8, 8, 8, 8, 8, 8])
    window.rejoined()
    assert window.asked == 32
    assert window.done([32, 8, 8, 8, 8, 8, 8, 8]) > 1  # grows again from the start window
