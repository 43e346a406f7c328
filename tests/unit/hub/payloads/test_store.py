"""The generator's payload store and its server, and the fetcher scorers and the trainer use:
bounded, each refusal with its code, digests checked, CURVE like every server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from grpo_stream.config import RunConfig
from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.hub.payloads.store import (
    PayloadFetcher,
    PayloadOutbox,
    PayloadRef,
    PayloadServer,
    PayloadStore,
    rollout_meta,
    store_capacity,
)
from grpo_stream.protocols import messages as m
from grpo_stream.protocols.digest import payload_digest
from grpo_stream.protocols.payloads import PayloadRequest, RolloutMeta
from grpo_stream.transport.curve import init_keys
from grpo_stream.transport.sockets import Client, Context, close_context, make_context

LOCAL = "tcp://127.0.0.1:0"
SETTINGS = TransportSettings(io_timeout_ms=2000)
PLAIN = SecuritySettings()


def rollout(gid: int, g: int = 2, first_token: int = 5) -> m.Rollout:
    return m.Rollout(
        lease_id=1, group_id=gid, instance="gen-0", policy_version=3,
        prompt_ids=np.array([1, 2], np.int32),
        completion_ids=np.arange(first_token, first_token + 3 * g, dtype=np.int32),
        completion_offsets=np.arange(0, 3 * g + 1, 3, dtype=np.int64),
        logprobs=np.full(3 * g, -0.5, np.float32), texts=["3"] * g, truncated=[False] * g,
        gen_seconds=0.1, sampling=m.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=8),
    )  # fmt: skip


@pytest.fixture
def ctx() -> Iterator[Context]:
    context = make_context()
    yield context
    close_context(context)


def test_digest_changes_with_any_token() -> None:
    assert payload_digest(rollout(1)) == payload_digest(rollout(1))
    assert payload_digest(rollout(1)) != payload_digest(rollout(1, first_token=6))
    assert len(payload_digest(rollout(1))) == 32


def test_store_answers_the_rollout_for_its_digest() -> None:
    store = PayloadStore(4)
    digest = store.put(rollout(7))
    assert store.answer(PayloadRequest(group_id=7, digest=digest)) == rollout(7)


@pytest.mark.parametrize(
    ("gid", "digest", "code"),
    [
        (7, "0" * 32, "payload_wrong_digest"),
        (0, None, "payload_evicted"),
        (99, None, "payload_unknown_group"),
    ],
)
def test_store_refuses_with_one_code(gid: int, digest: str | None, code: str) -> None:
    store = PayloadStore(2)
    digests = {i: store.put(rollout(i)) for i in (0, 5, 7)}  # 0 is evicted by 7
    reply = store.answer(PayloadRequest(group_id=gid, digest=digest or digests.get(gid, "")))
    assert isinstance(reply, m.Error) and reply.code == code
    assert store.refused == 1 and len(store) == 2


def test_store_capacity_covers_what_the_hub_can_hold() -> None:
    cfg = RunConfig()
    hub = cfg.hub
    assert store_capacity(cfg) > hub.replay.capacity + hub.groups_per_step * hub.max_staleness


def test_fetcher_gets_payloads_from_two_stores_in_one_fetch(ctx: Context) -> None:
    stores = [PayloadStore(8), PayloadStore(8)]
    servers = [PayloadServer(ctx, LOCAL, SETTINGS, PLAIN, s) for s in stores]
    refs = []
    for gid in range(4):
        store, server = stores[gid % 2], servers[gid % 2]
        refs.append(PayloadRef(gid, server.address, store.put(rollout(gid))))
    fetcher = PayloadFetcher(ctx, SETTINGS, PLAIN, "trainer", timeout_s=5.0)
    got = fetcher.fetch(refs)
    assert got == {gid: rollout(gid) for gid in range(4)}
    fetcher.close()
    for server in servers:
        server.close()


def test_fetcher_reports_codes_in_request_order(ctx: Context) -> None:
    store = PayloadStore(8)
    server = PayloadServer(ctx, LOCAL, SETTINGS, PLAIN, store)
    digest = store.put(rollout(1))
    fetcher = PayloadFetcher(ctx, SETTINGS, PLAIN, "scorer", timeout_s=5.0)
    got = fetcher.fetch(
        [
            PayloadRef(2, server.address, digest),  # never held
            PayloadRef(1, server.address, digest),
            PayloadRef(1, server.address, "f" * 32),  # duplicate id: the last answer wins
        ]
    )
    assert got == {2: "payload_unknown_group", 1: "payload_wrong_digest"}
    fetcher.close()
    server.close()


def test_a_store_that_does_not_answer_is_unreachable(ctx: Context) -> None:
    fetcher = PayloadFetcher(ctx, SETTINGS, PLAIN, "trainer", timeout_s=0.3)
    got = fetcher.fetch([PayloadRef(1, "tcp://127.0.0.1:9", "0" * 32)])  # nothing listens
    assert got == {1: "unreachable"}
    fetcher.close()


def test_a_payload_that_is_not_the_announced_one_is_a_mismatch(ctx: Context) -> None:
    store = PayloadStore(8)
    server = PayloadServer(ctx, LOCAL, SETTINGS, PLAIN, store)
    store.put(rollout(1))
    tampered = rollout(1, first_token=9)
    # a generator that announces one payload and serves another under that digest
    with store._lock:
        store._held[1] = (payload_digest(tampered), rollout(1))
    fetcher = PayloadFetcher(ctx, SETTINGS, PLAIN, "trainer", timeout_s=5.0)
    got = fetcher.fetch([PayloadRef(1, server.address, payload_digest(tampered))])
    assert got == {1: "mismatch"}
    fetcher.close()
    server.close()


def test_outbox_keeps_the_rollout_and_sends_its_meta(ctx: Context) -> None:
    sent: list[m.Message] = []

    class Link:
        def send(self, msg: m.Message) -> None:
            sent.append(msg)

    outbox = PayloadOutbox(Link(), ctx, RunConfig(), PLAIN)
    outbox.send(rollout(4))
    (meta,) = sent
    assert isinstance(meta, RolloutMeta)
    assert meta == rollout_meta(rollout(4), outbox.server.address, payload_digest(rollout(4)))
    assert list(meta.completion_lens) == [3, 3] and meta.prompt_len == 2
    fetcher = PayloadFetcher(ctx, SETTINGS, PLAIN, "trainer", timeout_s=5.0)
    assert fetcher.fetch([PayloadRef(4, meta.source, meta.digest)]) == {4: rollout(4)}
    fetcher.close()
    outbox.close()


def test_store_is_curve_secured(ctx: Context, tmp_path: Path) -> None:
    init_keys(tmp_path / "keys")
    secure = SecuritySettings(curve=True, keys_dir=tmp_path / "keys", client_name="trainer")
    store = PayloadStore(4)
    server = PayloadServer(ctx, LOCAL, SETTINGS, secure, store)
    digest = store.put(rollout(3))
    fetcher = PayloadFetcher(ctx, SETTINGS, secure, "trainer", timeout_s=5.0)
    assert fetcher.fetch([PayloadRef(3, server.address, digest)]) == {3: rollout(3)}
    plain = Client(ctx, server.address, SETTINGS, PLAIN, "plain")
    plain.send(PayloadRequest(group_id=3, digest=digest))
    assert plain.recv(500) is None  # a plaintext peer gets nothing
    plain.close()
    fetcher.close()
    server.close()
