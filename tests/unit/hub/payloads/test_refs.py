"""References instead of payloads: the trainer builds from a TrainBatchRef and the fetched
Rollouts exactly the TrainBatch the hub would have built; what differs is refused."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from grpo_stream.config.algo import AdvantageSettings
from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.hub.batches import assemble, build_step, offline_stats
from grpo_stream.hub.payloads.refs import (
    build_ref_step,
    check_meta,
    check_payload,
    fetch_batch,
    materialize,
    score_request_of,
    shell_rollout,
)
from grpo_stream.hub.payloads.store import PayloadFetcher, PayloadServer, PayloadStore, rollout_meta
from grpo_stream.protocols import messages as m
from grpo_stream.protocols.digest import payload_digest
from grpo_stream.protocols.payloads import PayloadLost, ScoreRef
from grpo_stream.transport.sockets import Context, close_context, make_context

sys.path.insert(0, str(Path(__file__).parent))
from test_store import rollout


def scored(gid: int, rewards: list[float]) -> m.Scored:
    return m.Scored(
        lease_id=2, group_id=gid, rewards=np.array(rewards, np.float32),
        component_names=["exact"], components=np.array([rewards], np.float32), errors=[],
    )  # fmt: skip


def ragged(gid: int) -> m.Rollout:
    """A group of 3 completions of 2, 0 and 4 tokens."""
    base = rollout(gid, g=3)
    base.completion_ids = np.arange(10, 16, dtype=np.int32)
    base.completion_offsets = np.array([0, 2, 2, 6], np.int64)
    base.logprobs = np.linspace(-2, -0.1, 6, dtype=np.float32)
    return base


REWARDS = {0: [1.0, 0.0, 1.0], 1: [0.0, float("nan"), 1.0], 2: [1.0, 0.0, 0.0]}


def both_ways(world: int = 1) -> tuple[list[m.TrainBatch], list[m.TrainBatch]]:
    """(the hub's TrainBatches from full Rollouts, the trainer's from refs + payloads)."""
    settings = AdvantageSettings()
    full, shells, fetched = [], [], {}
    for gid, rewards in REWARDS.items():
        ro = ragged(gid)
        full.append(assemble(ro, scored(gid, rewards), settings, None).group)
        meta = rollout_meta(ro, "tcp://127.0.0.1:1", payload_digest(ro))
        shell = assemble(shell_rollout(meta), scored(gid, rewards), settings, None).group
        shell.source, shell.digest = meta.source, meta.digest
        shells.append(shell)
        fetched[gid] = ro
    stats = offline_stats(full)
    hub = build_step(5, full, stats, world)
    refs = build_ref_step(5, shells, stats, world)
    return hub, [materialize(ref, fetched) for ref in refs]


@pytest.mark.parametrize("world", [1, 2])
def test_trainer_builds_the_batch_the_hub_would_have_sent(world: int) -> None:
    hub, trainer = both_ways(world)
    assert trainer == hub


def test_ref_carries_no_token() -> None:
    settings = AdvantageSettings()
    ro = ragged(0)
    meta = rollout_meta(ro, "tcp://127.0.0.1:1", payload_digest(ro))
    shell = assemble(shell_rollout(meta), scored(0, REWARDS[0]), settings, None).group
    (ref,) = build_ref_step(0, [shell], offline_stats([shell]))
    assert len(shell.completion_ids) == 0 and len(shell.logprobs) == 0
    assert list(ref.completion_lens) == [2, 0, 4] and ref.totals.num_tokens == 6


def _one_ref() -> tuple[m.Rollout, object]:
    settings = AdvantageSettings()
    ro = ragged(0)
    meta = rollout_meta(ro, "tcp://127.0.0.1:1", payload_digest(ro))
    shell = assemble(shell_rollout(meta), scored(0, REWARDS[0]), settings, None).group
    shell.source, shell.digest = meta.source, meta.digest
    return ro, build_ref_step(0, [shell], offline_stats([shell]))[0]


def test_payload_with_other_lengths_is_refused() -> None:
    ro, ref = _one_ref()
    ro.completion_offsets = np.array([0, 3, 3, 6], np.int64)
    assert "lengths" in str(check_payload(ref, 0, ro))  # type: ignore[arg-type]


def test_payload_of_another_version_is_refused() -> None:
    ro, ref = _one_ref()
    ro.policy_version = 9
    assert "v9" in str(check_payload(ref, 0, ro))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"completion_lens": np.array([1, 2], np.int64)}, "completions"),
        ({"completion_lens": np.array([1, -2, 3], np.int64)}, "negative"),
        ({"digest": "xyz"}, "digest"),
        ({"source": "http://x"}, "source"),
    ],
)
def test_meta_that_the_hub_cannot_account_for_is_refused(
    change: dict[str, object], why: str
) -> None:
    meta = rollout_meta(ragged(0), "tcp://127.0.0.1:1", payload_digest(ragged(0)))
    assert check_meta(meta, 3) is None
    for key, value in change.items():
        setattr(meta, key, value)
    assert why in str(check_meta(meta, 3))


def test_score_request_uses_the_hubs_prompt_and_the_fetched_texts() -> None:
    ref = ScoreRef(lease_id=4, group_id=0, prompt="hub's", reference={"answer": "7"},
                   source="tcp://127.0.0.1:1", digest="0" * 32)  # fmt: skip
    ro = ragged(0)
    ro.texts = ["a", "b", "c"]
    ro.prompt, ro.reference = "generator's", {"answer": "lie"}
    request = score_request_of(ref, ro, group_size=3)
    assert isinstance(request, m.ScoreRequest)
    assert (request.prompt, request.reference, request.completions) == (
        "hub's", {"answer": "7"}, ["a", "b", "c"],
    )  # fmt: skip
    lost = score_request_of(ref, "payload_evicted", group_size=3)
    assert isinstance(lost, PayloadLost) and lost.group_ids == [0]
    assert lost.codes == ["payload_evicted"]


@pytest.fixture
def ctx() -> Iterator[Context]:
    context = make_context()
    yield context
    close_context(context)


def test_fetch_batch_names_the_groups_it_could_not_get(ctx: Context) -> None:
    settings, plain = TransportSettings(io_timeout_ms=2000), SecuritySettings()
    store = PayloadStore(8)
    server = PayloadServer(ctx, "tcp://127.0.0.1:0", settings, plain, store)
    adv = AdvantageSettings()
    shells = []
    for gid in (0, 1):
        ro = ragged(gid)
        digest = store.put(ro) if gid == 0 else payload_digest(ro)  # group 1 never stored
        meta = rollout_meta(ro, server.address, digest)
        shell = assemble(shell_rollout(meta), scored(gid, REWARDS[0]), adv, None).group
        shell.source, shell.digest = meta.source, meta.digest
        shells.append(shell)
    fetcher = PayloadFetcher(ctx, settings, plain, "trainer", timeout_s=5.0)
    (ref,) = build_ref_step(3, shells, offline_stats(shells))
    lost = fetch_batch(fetcher, ref, version=2, attempt=1)
    assert isinstance(lost, PayloadLost)
    assert (lost.group_ids, lost.codes) == ([1], ["payload_unknown_group"])
    assert (lost.step, lost.trainer_version, lost.attempt) == (3, 2, 1)
    store.put(ragged(1))
    assert isinstance(fetch_batch(fetcher, ref, version=2, attempt=1), m.TrainBatch)
    fetcher.close()
    server.close()
