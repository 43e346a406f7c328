"""Dynamic sampling with refill: zero-signal groups are replaced up to hub.max_refill_ratio
per step, past it the step runs short by them; the gate plans replacements from the signal
rate and the ledger's accounting holds throughout."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from grpo_stream.config import ConfigError, HubSettings, config_from_dict
from grpo_stream.hub.batches import offline_stats
from grpo_stream.hub.ledger import Ledger
from grpo_stream.hub.ledger_state import ledger_state, load_ledger
from grpo_stream.hub.replay import Group, ReplayBuffer
from grpo_stream.hub.serving import BatchDesk
from grpo_stream.protocols import messages as m

sys.path.insert(0, str(Path(__file__).parent))
from test_replay import group

GPS = 4


def ledger(ratio: float, staleness: int = 0, ahead: bool = False) -> Ledger:
    return Ledger(GPS, staleness, 10.0, max_refill_ratio=ratio, refill_ahead=ahead)


def generate_and_score(lg: Ledger, n: int) -> list[int]:
    """Lease `n` groups and take each through generation and scoring (to `buffered`)."""
    taken = lg.take_for_generation("gen", n, now=0.0)
    assert taken is not None
    ids = sorted(taken[0].group_ids)
    for gid in ids:
        assert lg.accept_rollout(gid)
        assert lg.take_for_scoring("scorer", now=0.0) is not None
        assert lg.accept_scored(gid)
    return ids


def test_refilled_groups_free_their_slot_for_a_new_prompt() -> None:
    lg = ledger(ratio=0.5)  # 2 refills per step of 4
    ids = generate_and_score(lg, GPS)
    assert lg.pipeline().capacity() == 0
    assert lg.drop_zero_signal(ids[0]) and lg.drop_zero_signal(ids[1])
    assert lg.pipeline().capacity() == 2 and lg.refill.holes == 0
    assert lg.summary()["refilled"] == 2 and lg.summary()["filtered"] == 2
    lg.check_invariant()


def test_past_the_refill_bound_a_zero_signal_group_leaves_a_hole_and_the_step_runs_short() -> None:
    lg = ledger(ratio=0.25)  # 1 refill per step
    ids = generate_and_score(lg, GPS)
    assert lg.drop_zero_signal(ids[0])  # refilled
    assert not lg.drop_zero_signal(ids[1])  # the bound: a hole
    assert lg.refill.holes == 1 and lg.refill.need() == GPS - 1
    assert lg.pipeline().capacity() == 1  # the hole keeps its slot; the refill freed one
    lg.check_invariant()


def test_filter_only_never_refills() -> None:
    lg = ledger(ratio=0.0)
    ids = generate_and_score(lg, GPS)
    assert not lg.drop_zero_signal(ids[0])
    assert lg.summary()["refilled"] == 0 and lg.refill.holes == 1 and lg.pipeline().capacity() == 0


def test_a_served_step_spends_its_holes_and_renews_the_refills() -> None:
    lg = ledger(ratio=0.25)
    ids = generate_and_score(lg, GPS)
    lg.drop_zero_signal(ids[0])
    lg.drop_zero_signal(ids[1])
    assert (lg.refill.holes, lg.refill.used) == (1, 1)
    lg.step_served(0, groups=GPS - 1)  # the short step: 3 groups and its hole
    assert (lg.refill.holes, lg.refill.used) == (0, 0)


def test_a_full_step_leaves_the_holes_to_the_next() -> None:
    lg = ledger(ratio=0.0)
    ids = generate_and_score(lg, GPS)
    lg.drop_zero_signal(ids[0])
    lg.step_served(0, groups=GPS)  # the buffer already held a full step
    assert lg.refill.holes == 1


def test_a_whole_step_of_holes_is_dropped_as_an_empty_step_so_the_gate_never_closes() -> None:
    lg = ledger(ratio=0.0)
    for gid in generate_and_score(lg, GPS):
        lg.drop_zero_signal(gid)
    assert lg.refill.holes == 0 and lg.summary()["empty_steps"] == 1
    assert lg.pipeline().capacity() == GPS  # the gate opens again: nothing is left in the pipeline
    lg.check_invariant()


def test_the_signal_rate_is_the_share_of_recent_groups_with_signal() -> None:
    lg = ledger(ratio=1.0)
    assert lg.refill.signal_rate() == 1.0  # before any
    for had_signal in [True, False, True, True]:
        lg.refill.observe(had_signal)
    assert lg.refill.signal_rate() == 0.75
    for _ in range(4 * GPS):  # a window of four steps' worth
        lg.refill.observe(False)
    assert lg.refill.signal_rate() == 0.0


def test_a_hole_moves_new_prompts_a_slot_later_at_the_gate() -> None:
    lg = ledger(ratio=0.0, staleness=1)
    lg.versions.next_version = 5
    ids = generate_and_score(lg, 3)
    lg.drop_zero_signal(ids[0])  # 2 buffered + 1 hole: the next prompt is the 4th slot
    assert lg.pipeline().min_version(1) == 4 and lg.pipeline().min_version(2) == 5


def test_a_lease_stops_where_its_prompts_would_need_a_newer_version() -> None:
    lg = ledger(ratio=1.0, staleness=1)
    lg.versions.next_version = 5
    generate_and_score(lg, 2)  # two slots of step 5 taken
    lease, min_version = lg.take_for_generation("gen", 8, now=0.0) or (None, -1)
    # the two slots left of the next step, at version 4; not the ones that need version 5
    assert lease is not None and len(lease.group_ids) == 2 and min_version == 4
    lease, min_version = lg.take_for_generation("gen", 8, now=0.0) or (None, -1)
    assert lease is not None and len(lease.group_ids) == 4 and min_version == 5


def test_ahead_the_gate_plans_replacements_from_the_signal_rate_up_to_the_bound() -> None:
    lg = ledger(ratio=1.0, staleness=1, ahead=True)  # 8 slots, at most 2 prompts per slot
    for had_signal in [True, False, True, False]:  # half the groups come back with signal
        lg.refill.observe(had_signal)
    assert lg.pipeline().capacity() == 16  # 8 slots / 0.5
    capped = ledger(ratio=0.5, staleness=1, ahead=True)
    for had_signal in [True, False, False, False]:
        capped.refill.observe(had_signal)
    assert capped.pipeline().capacity() == 12  # 1 / 0.25 = 4 per slot, capped at 1 + 0.5
    without = ledger(ratio=1.0, staleness=1)
    for had_signal in [True, False, True, False]:
        without.refill.observe(had_signal)
    assert without.pipeline().capacity() == 8  # not ahead: one prompt per slot


def refill_used() -> Ledger:
    """A ledger ahead, max_refill_ratio 0.25 at a signal rate of 1/2: the step's one refill,
    used on a group without signal."""
    lg = ledger(ratio=0.25, staleness=1, ahead=True)
    for had_signal in [True, False]:
        lg.refill.observe(had_signal)
    ids = generate_and_score(lg, 2)
    assert lg.drop_zero_signal(ids[0])  # the step's one refill is used
    return lg


def test_ahead_without_refills_left_the_gate_lets_out_one_prompt_per_slot() -> None:
    lg = refill_used()
    assert lg.pipeline().capacity() == 2 * GPS - 1  # 8 slots, one buffered group


def test_ahead_prompts_are_planned_for_the_step_they_are_expected_in() -> None:
    lg = ledger(ratio=1.0, staleness=1, ahead=True)
    lg.versions.next_version = 10
    for had_signal in [True, False]:
        lg.refill.observe(had_signal)
    _, first = lg.take_for_generation("gen", 8, now=0.0) or (None, -1)
    _, second = lg.take_for_generation("gen", 8, now=0.0) or (None, -1)
    # 8 prompts at a signal rate of 1/2 fill 4 slots (the next step), the next 8 the step after
    assert (first, second) == (9, 10)


def test_the_refill_state_survives_a_checkpoint() -> None:
    lg = ledger(ratio=0.25)
    ids = generate_and_score(lg, GPS)
    lg.refill.observe(False)
    lg.drop_zero_signal(ids[0])
    lg.drop_zero_signal(ids[1])
    back = ledger(ratio=0.25)
    load_ledger(back, ledger_state(lg), scored=set())
    assert (back.refill.holes, back.refill.used, list(back.refill.signals)) == (1, 1, [False])
    back.check_invariant()


def test_the_invariant_catches_more_refills_than_filtered_groups() -> None:
    lg = ledger(ratio=1.0)
    lg.counters["refilled"] = 1
    with pytest.raises(AssertionError, match="refilled=1 > filtered=0"):
        lg.check_invariant()


class Desk:
    def __init__(self, ratio: float) -> None:
        self.ledger = ledger(ratio, staleness=1)
        self.buffer = ReplayBuffer(capacity=64)
        self.sent: list[m.TrainBatch] = []
        hub = HubSettings(groups_per_step=GPS, max_staleness=1, max_refill_ratio=ratio)
        self.desk = BatchDesk(hub, self.ledger, self.buffer, self._send, self._stats)

    def _send(self, identity: bytes, msg: m.Message) -> None:
        assert isinstance(msg, m.TrainBatch)
        self.sent.append(msg)

    def _stats(self, groups: list[Group]) -> m.StepStats:
        return offline_stats(groups)

    def score(self, signal: list[bool]) -> None:
        """Groups come back with (True) or without signal: buffered or dropped."""
        for gid, has in zip(generate_and_score(self.ledger, len(signal)), signal, strict=True):
            if has:
                self.buffer.add(group(gid, 0))
            else:
                self.ledger.drop_zero_signal(gid)


def test_desk_serves_a_step_short_by_its_holes() -> None:
    d = Desk(ratio=0.0)
    d.score([True, False, True, True])
    d.desk.add(b"r0", m.BatchRequest(step=0, trainer_version=0))
    d.desk.serve()
    assert len(d.sent) == 1 and len(np.asarray(d.sent[0].group_ids)) == 3
    assert d.ledger.refill.holes == 0
    d.ledger.check_invariant()


def test_desk_waits_for_a_full_step_while_refills_last() -> None:
    d = Desk(ratio=0.25)
    d.score([True, False, True, True])  # the one zero-signal group is refilled
    d.desk.add(b"r0", m.BatchRequest(step=0, trainer_version=0))
    d.desk.serve()
    assert d.sent == []
    d.score([True])  # its replacement
    d.desk.serve()
    assert len(np.asarray(d.sent[0].group_ids)) == GPS


def test_config_bounds_the_refill_ratio() -> None:
    with pytest.raises(ConfigError, match="max_refill_ratio"):
        config_from_dict({"hub": {"max_refill_ratio": -1}})


def test_ahead_a_lease_holds_a_steps_prompts_and_their_expected_replacements() -> None:
    lg = ledger(ratio=1.0, staleness=1, ahead=True)
    for had_signal in [True, True, True, False]:  # a quarter of the groups without signal
        lg.refill.observe(had_signal)
    assert lg.refill.lease(16, ahead=True) == 22  # ceil(16 / 0.75)
    assert lg.refill.lease(16, ahead=False) == 16
    capped = ledger(ratio=0.25, staleness=1, ahead=True)
    for had_signal in [True, False, False, False]:
        capped.refill.observe(had_signal)
    assert capped.refill.lease(16, ahead=True) == 20  # 4 per slot, capped at 1 + 0.25


def test_ahead_once_the_steps_refills_are_used_a_lease_is_a_steps_prompts() -> None:
    lg = refill_used()
    assert lg.refill.lease(16, ahead=True) == 16
