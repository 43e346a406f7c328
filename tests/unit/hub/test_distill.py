"""The hub's side of distillation: groups wait for a teacher under leases (exactly once, a lost
or late teacher's groups go back to the queue), Taught is checked before it changes anything,
and a taught group enters the buffer with its per-token advantages."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from grpo_stream.config import ConfigError, config_from_dict
from grpo_stream.hub.batches import build_batch
from grpo_stream.hub.distill import Teaching, check_taught, step_kl
from grpo_stream.hub.ledger import Ledger
from grpo_stream.hub.ledger_state import ledger_state, load_ledger
from grpo_stream.hub.replay import Group
from grpo_stream.protocols.distill import Taught

sys.path.insert(0, str(Path(__file__).parent))
from test_refill import generate_and_score
from test_replay import group

TEACHER_LP = np.array([-0.5, -0.25, -1.0], np.float32)  # group()'s three completion tokens


class Hub:
    """A ledger, the teaching desk, and the buffer it fills."""

    def __init__(self, weight: float = 1.0) -> None:
        self.ledger = Ledger(4, 1, lease_timeout_s=10.0, teach_timeout_s=2.0)
        self.buffered: list[Group] = []
        self.teaching = Teaching(weight, self.ledger, self.buffered.append)

    def hold(self, n: int) -> list[int]:
        ids = generate_and_score(self.ledger, n)
        for gid in ids:
            self.teaching.hold(group(gid))
        return ids


def taught(gid: int, lease: int = 0, lp: np.ndarray = TEACHER_LP, error: str = "") -> Taught:
    return Taught(lease_id=lease, group_id=gid, logprobs=lp, error=error)


def test_a_taught_group_enters_the_buffer_with_its_token_advantages() -> None:
    hub = Hub(weight=1.0)
    (gid,) = hub.hold(1)
    lease, got = hub.ledger.take_for_teaching("teacher-0", now=0.0) or (None, -1)
    assert lease is not None and got == gid and hub.ledger.stage[gid] == "teaching"
    hub.teaching.on_taught(taught(gid, lease.lease_id))
    assert [g.group_id for g in hub.buffered] == [gid] and hub.ledger.stage[gid] == "buffered"
    student = group(gid).logprobs
    np.testing.assert_allclose(hub.buffered[0].token_advantages, TEACHER_LP - student, atol=1e-6)
    batch = build_batch(0, hub.buffered)  # the trainer gets them per token
    np.testing.assert_allclose(batch.token_advantages, TEACHER_LP - student, atol=1e-6)
    # the step's distill_kl is its taught groups' own, whenever they were taught
    assert step_kl(hub.buffered) == pytest.approx(float(np.mean(student - TEACHER_LP)))
    assert math.isnan(step_kl([group(gid + 1)]))  # an untaught group has none
    hub.ledger.check_invariant()


def test_a_duplicate_taught_is_dropped_and_counted() -> None:
    hub = Hub()
    (gid,) = hub.hold(1)
    hub.ledger.take_for_teaching("teacher-0", now=0.0)
    hub.teaching.on_taught(taught(gid))
    hub.teaching.on_taught(taught(gid))
    assert len(hub.buffered) == 1


def test_a_lost_teachers_group_goes_back_to_the_queue_and_is_taught_once() -> None:
    hub = Hub()
    (gid,) = hub.hold(1)
    hub.ledger.take_for_teaching("teacher-0", now=0.0)
    assert hub.ledger.release_holder("teacher-0") == 1
    assert list(hub.ledger.to_teach) == [gid] and hub.ledger.summary()["requeued_teach"] == 1
    hub.ledger.take_for_teaching("teacher-1", now=0.0)
    hub.teaching.on_taught(taught(gid))
    hub.teaching.on_taught(taught(gid))  # the lost one came back late
    assert len(hub.buffered) == 1 and hub.ledger.counters["duplicates_dropped"] == 1
    hub.ledger.check_invariant()


def test_a_teacher_lease_expires_after_teacher_timeout_not_the_hubs() -> None:
    hub = Hub()
    hub.hold(1)
    hub.ledger.take_for_teaching("teacher-0", now=0.0)
    assert hub.ledger.expire(now=1.0) == 0
    assert hub.ledger.expire(now=2.5) == 1  # teach_timeout_s = 2, lease_timeout_s = 10


def test_a_teacher_error_ends_the_group_failed_never_trained_without_its_teacher() -> None:
    hub = Hub()
    (gid,) = hub.hold(1)
    hub.ledger.take_for_teaching("teacher-0", now=0.0)
    hub.teaching.on_taught(taught(gid, lp=np.zeros(0, np.float32), error="too long"))
    assert hub.buffered == [] and hub.ledger.summary()["failed"] == 1
    assert hub.ledger.counters["teacher_failed"] == 1
    hub.ledger.check_invariant()


def test_groups_waiting_for_a_teacher_are_generated_again_after_a_hub_restart() -> None:
    hub = Hub()
    ids = hub.hold(2)
    hub.ledger.take_for_teaching("teacher-0", now=0.0)
    back = Ledger(4, 1, lease_timeout_s=10.0)
    load_ledger(back, ledger_state(hub.ledger), scored=set())
    assert sorted(back.retry) == ids and not back.to_teach
    back.check_invariant()


@pytest.mark.parametrize(
    ("lp", "why"),
    [
        (np.array([-0.5, -0.2], np.float32), "2 log-probs for 3 tokens"),
        (np.array([-0.5, np.nan, -1.0], np.float32), "finite and at most 0"),
        (np.array([-0.5, 0.5, -1.0], np.float32), "finite and at most 0"),
    ],
)
def test_a_taught_that_does_not_fit_its_group_is_refused(lp: np.ndarray, why: str) -> None:
    refused = check_taught(taught(0, lp=lp), group(0))
    assert refused is not None and why in refused


def test_a_taught_that_fits_or_reports_an_error_is_accepted() -> None:
    assert check_taught(taught(0), group(0)) is None
    assert check_taught(taught(0, lp=np.zeros(0, np.float32), error="x"), group(0)) is None


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"env": {"name": "guess"}, "task": {"name": "guess"}}, "single-turn"),
        ({"hub": {"payloads": "direct"}}, "hub.payloads = 'hub'"),
        ({"teacher": {"engine": "vllm"}, "generator": {"temperature": 0.7}}, "temperature = 1"),
    ],
)
def test_config_refuses_distillation_where_it_cannot_run(extra: dict, match: str) -> None:
    data = {"algo": {"distill": {"teacher": "grpo-stream/tiny-arith"}}, **extra}
    with pytest.raises(ConfigError, match=match):
        config_from_dict(data)


def test_config_bounds_the_distillation_weight() -> None:
    with pytest.raises(ConfigError, match="weight"):
        config_from_dict({"algo": {"distill": {"teacher": "x", "weight": 1.5}}})


def test_only_the_teacher_holding_the_lease_is_its_holder() -> None:
    hub = Hub()
    (gid,) = hub.hold(1)
    taken = hub.ledger.take_for_teaching("teacher-0", now=0.0)
    assert taken is not None
    lease, got = taken
    assert got == gid
    assert hub.ledger.leases.issued_to(lease.lease_id, gid, "teacher-0", "teach") is None
    assert hub.ledger.leases.issued_to(lease.lease_id, gid, "teacher-1", "teach") is not None
    assert hub.ledger.leases.issued_to(lease.lease_id, gid, "teacher-0", "score") is not None
