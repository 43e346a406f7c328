"""A batch that kills the trainer is not served again as is: after `crash_limit` deaths of the
rank-0 trainer holding the last step, the repeated request gets new groups, the old ones end
failed, the ledger balances and the hub checkpoints."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from grpo_stream.protocols import messages as m

sys.path.insert(0, str(Path(__file__).parent))
from test_serving import GPS, Desk, request


def served(d: Desk) -> list[list[int]]:
    return [[int(g) for g in msg.group_ids] for _, msg in d.sent if isinstance(msg, m.TrainBatch)]


def step_zero_served(groups: int) -> tuple[Desk, list[int]]:
    """A desk (crash_limit 2; its checkpoints counted) with `groups` buffered, step 0's
    batch served to trainer "t"."""
    d = Desk()
    checkpoints: list[int] = []
    d.desk.crash_limit = 2
    d.desk.checkpoint = lambda: checkpoints.append(1)
    d.buffer_groups(groups)
    d.desk.add(b"t", request(0))
    d.desk.serve()
    return d, checkpoints


def test_one_death_gets_the_same_batch_again() -> None:
    d, checkpoints = step_zero_served(2 * GPS)
    d.desk.trainer_died()
    d.desk.add(b"t2", request(0))  # the restarted trainer asks again: exactly-once resend
    assert served(d)[0] == served(d)[1] and checkpoints == []


def test_the_batch_the_trainer_died_on_twice_is_replaced_by_new_groups() -> None:
    d, checkpoints = step_zero_served(2 * GPS)
    first = served(d)[0]
    for _ in range(2):
        d.desk.trainer_died()
        d.desk.add(b"t", request(0))
    d.desk.serve()
    batches = served(d)
    assert batches[:2] == [first, first] and len(batches) == 3  # one resend, then new groups
    assert not set(batches[2]) & set(first)
    summary = d.ledger.summary()
    assert summary["failed"] == GPS and summary["trained"] == GPS
    d.ledger.check_invariant()
    assert checkpoints == [1]
    assert not {g.group_id for g in d.buffer.groups()} & set(first)


def test_a_death_after_the_next_step_was_asked_does_not_count() -> None:
    d, _ = step_zero_served(3 * GPS)
    d.desk.trainer_died()
    d.desk.add(b"t", request(1))  # it got past step 0
    d.desk.serve()
    d.desk.trainer_died()
    d.desk.add(b"t", request(1))
    assert d.desk.deaths == 1 and served(d)[-1] == served(d)[-2]
    assert np.all(d.ledger.summary()["failed"] == 0)
