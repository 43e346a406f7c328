"""The ledger's counters and the exactly-once check over them."""

from __future__ import annotations

import pytest

from grpo_stream.hub.accounts import Accounts


def test_a_retracted_or_discarded_step_moves_its_groups_to_another_end() -> None:
    accounts = Accounts(dispatched=10, trained=10)
    accounts.retract_trained(3)
    accounts.discard_trained(2)
    assert (accounts["trained"], accounts["failed"], accounts["discarded"]) == (5, 3, 2)
    accounts.check(in_progress=0)


def test_a_group_neither_ended_nor_in_progress_fails_the_check() -> None:
    accounts = Accounts(dispatched=5, trained=3, stale=1)
    with pytest.raises(AssertionError, match=r"dispatched=5 != terminal=4 \+ in_progress=0"):
        accounts.check(in_progress=0)
    accounts.check(in_progress=1)


def test_more_refills_than_filtered_groups_fails_the_check() -> None:
    accounts = Accounts(dispatched=2, filtered=1, refilled=2, trained=1)
    with pytest.raises(AssertionError, match="refilled=2 > filtered=1"):
        accounts.check(in_progress=0)


def test_the_summary_counts_what_is_still_in_progress() -> None:
    summary = Accounts(dispatched=4, trained=1, duplicates_dropped=2).summary(in_progress=3)
    assert (summary["dispatched"], summary["trained"], summary["in_progress"]) == (4, 1, 3)
    assert summary["duplicates_dropped"] == 2 and summary["failed"] == 0
