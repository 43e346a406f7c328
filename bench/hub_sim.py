"""Simulated services for `bench.hub_load`: many peers per process, no model.

Each simulated peer is one DEALER socket (our `Client`) under its own identity that joins the
real hub as `up`'s services do: with the run's secret, a signed Hello (`grpo_stream.hub.auth`)
and every message after it sealed with the session's key (`grpo_stream.transport.seal`);
without one (`SECRET` given as "-"), neither. Then the hub's Welcome, credits (WorkRequest)
and heartbeats from its main socket. Every message goes through our codec.

- generator: answers each PromptBatch, after `delay_s`, with one synthetic Rollout per prompt
  (G completions of `tokens` tokens each, with texts and log-probs), then asks for as many
  credits again. It beats every `heartbeat_s` with its tokens/s (the hub's work shares).
- scorer: answers each ScoreRequest at once with Bernoulli(0.5) rewards (so groups carry a
  signal and reach the trainer), then asks for one more.
- trainer: asks for step s at version s, and for s + 1 as soon as its TrainBatch arrived.

With `--payloads direct` (the hub run with hub.payloads = "direct") a generator process keeps
its peers' Rollouts in one `PayloadStore` served on its own ROUTER and sends the hub
RolloutMetas; the scorers fetch each poll round's ScoreRefs in one pipelined fetch, the
trainer fetches and checks every group of its TrainBatchRef (`payload_refs.fetch_batch`,
digests included) and builds the TrainBatch, as the real services do.

Each peer records the latency of every dispatch it waits for: WorkRequest sent -> PromptBatch
(or ScoreRequest) received, BatchRequest sent -> TrainBatch received. A process runs its
peers (it touches OUT_JSON.joined once all are welcomed) until the file `--stop-file` exists,
`stop_at` (wall clock) or a Shutdown, then writes its counters and samples as JSON.
Run: `python -m bench.hub_sim ROLE HUB SECRET FIRST COUNT OUT_JSON [options]` (by hub_load).
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.hub.auth import load_secret, session_key, sign
from grpo_stream.hub.payloads.refs import fetch_batch, score_request_of
from grpo_stream.hub.payloads.store import (
    PayloadFetcher,
    PayloadRef,
    PayloadServer,
    PayloadStore,
    rollout_meta,
)
from grpo_stream.protocols import messages as m
from grpo_stream.protocols.payloads import PayloadLost, ScoreRef, TrainBatchRef
from grpo_stream.transport.seal import MAIN, Sealer
from grpo_stream.transport.sockets import Client, close_context, make_context

PROMPT_TOKENS = 32
STORE_GROUPS = 16384  # one process's store: more than the hub can hold un-trained
FETCH_TIMEOUT_S = 10.0


@dataclass
class Peer:
    """One simulated service instance: its socket and what it is waiting for."""

    instance: str
    client: Client
    asked_at: float | None = None  # when it last asked for work it has not got yet
    next_beat: float = 0.0
    busy_s: float = 0.0
    tokens: int = 0
    step: int = 0


@dataclass
class Record:
    """What one process saw, written as JSON at its end."""

    role: str
    peers: int
    latencies_s: list[float] = field(default_factory=list)
    stamps: list[float] = field(default_factory=list)  # wall time of each latency sample
    groups: list[tuple[float, int, int]] = field(default_factory=list)  # (time, groups, tokens)
    sent: int = 0  # every message sent to the hub (hub.payloads = direct: to the hub only)
    sent_series: list[tuple[float, int]] = field(default_factory=list)  # (wall time, sent)
    errors: dict[str, int] = field(default_factory=dict)


class Synthetic:
    """A generator's fixed payload: G completions of `tokens` tokens, shared by every Rollout
    (the codec sends the arrays as frames without copying them)."""

    def __init__(self, group_size: int, tokens: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.group_size = group_size
        self.prompt_ids = rng.integers(3, 1000, PROMPT_TOKENS, dtype=np.int32)
        self.ids = rng.integers(3, 1000, group_size * tokens, dtype=np.int32)
        self.offsets = np.arange(0, group_size * tokens + 1, tokens, dtype=np.int64)
        self.logprobs = -rng.random(group_size * tokens, dtype=np.float32)
        word = "abcd "  # ~ one token's text
        self.texts = [word * tokens for _ in range(group_size)]

    def rollout(self, batch: m.PromptBatch, i: int, instance: str, gen_s: float) -> m.Rollout:
        return m.Rollout(
            lease_id=batch.lease_id,
            group_id=int(batch.group_ids[i]),
            instance=instance,
            policy_version=batch.min_version,
            prompt_ids=self.prompt_ids,
            completion_ids=self.ids,
            completion_offsets=self.offsets,
            logprobs=self.logprobs,
            texts=self.texts,
            truncated=[False] * self.group_size,
            gen_seconds=gen_s,
            sampling=batch.sampling,
        )


def join_all(
    ctx: zmq.Context[Any], hub: str, service: str, names: list[str], secret: bytes | None,
    timeout_s: float = 120.0,
) -> list[Peer]:  # fmt: skip
    """Say Hello on one socket per name (signed, and the session sealed, with `secret`);
    wait until every one got its Welcome."""
    transport, security = TransportSettings(), SecuritySettings()
    peers = [Peer(n, Client(ctx, hub, transport, security, n)) for n in names]
    ranks = {p.instance: (i if service == "trainer" else 0) for i, p in enumerate(peers)}

    def hello(peer: Peer, challenge: str) -> None:
        host, rank = socket.gethostname(), ranks[peer.instance]
        msg = m.Hello(service, peer.instance, host, os.getpid(), capacity=1, rank=rank)
        if secret is not None:  # signed for the hub's challenge (its answer to the first)
            sign(msg, secret, challenge)
            peer.client.sealer = Sealer(session_key(secret, msg), MAIN)
        peer.client.send(msg)

    for peer in peers:
        hello(peer, "")
    waiting = {p.client.socket: p for p in peers}
    poller = zmq.Poller()
    for sock in waiting:
        poller.register(sock, zmq.POLLIN)
    deadline = time.monotonic() + timeout_s
    while waiting:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(waiting)} {service}s got no Welcome in {timeout_s:g} s")
        for sock, _ in poller.poll(1000):
            peer = waiting[sock]
            reply = peer.client.recv(0)
            if isinstance(reply, m.Challenge):
                hello(peer, reply.challenge)
            if isinstance(reply, m.Error):
                raise RuntimeError(f"{peer.instance}: hub refused Hello: {reply.message}")
            if isinstance(reply, m.Welcome):
                poller.unregister(sock)
                del waiting[sock]
    return peers


def _drain(peer: Peer) -> Iterator[m.Message]:
    while (msg := peer.client.recv(0)) is not None:
        yield msg


class Fleet:
    """The event loop of one process's peers."""

    def __init__(self, args: argparse.Namespace, peers: list[Peer], ctx: zmq.Context[Any]) -> None:
        self.args = args
        self.peers = peers
        self.by_socket = {p.client.socket: p for p in peers}
        self.record = Record(args.role, len(peers))
        self.due: list[tuple[float, int, str, m.PromptBatch]] = []  # heap of replies
        self.synthetic = Synthetic(args.group_size, args.tokens, seed=args.first)
        self.rng = np.random.default_rng(args.first)
        self.stopped = False
        self._seq = 0
        self._next_sample = 0.0  # when the sent counter is sampled next (once a second)
        self.store: PayloadServer | None = None  # --payloads direct, generators
        self.fetcher: PayloadFetcher | None = None  # --payloads direct, scorers and trainer
        self.refs: list[tuple[Peer, ScoreRef]] = []  # ScoreRefs of this poll round
        if args.payloads == "direct" and args.role == "generator":
            self.store = PayloadServer(ctx, "tcp://127.0.0.1:0", TransportSettings(),
                                       SecuritySettings(), PayloadStore(STORE_GROUPS))  # fmt: skip
        elif args.payloads == "direct":
            self.fetcher = PayloadFetcher(ctx, TransportSettings(), SecuritySettings(),
                                          args.role, FETCH_TIMEOUT_S)  # fmt: skip

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
        if self.fetcher is not None:
            self.fetcher.close()

    def start(self) -> None:
        now = time.monotonic()
        for i, peer in enumerate(self.peers):
            peer.next_beat = now + self.args.heartbeat_s * i / max(1, len(self.peers))
            if self.args.role == "trainer":
                self._ask_batch(peer, now)
            else:
                self._ask_work(peer, self.args.credits, now)

    def run(self, stop_at: float, stop_file: Path) -> Record:
        poller = zmq.Poller()
        for sock in self.by_socket:
            poller.register(sock, zmq.POLLIN)
        self.start()
        by_name = {p.instance: p for p in self.peers}
        while not self.stopped and time.time() < stop_at and not stop_file.exists():
            now = time.monotonic()
            wait = min(0.05, max(0.0, self.due[0][0] - now)) if self.due else 0.05
            for sock, _ in poller.poll(int(wait * 1000)):
                peer = self.by_socket[sock]
                for msg in _drain(peer):
                    self._on_message(peer, msg)
            if self.refs:
                self._score_refs()
            now = time.monotonic()
            while self.due and self.due[0][0] <= now:
                _, _, name, batch = heapq.heappop(self.due)
                self._answer(by_name[name], batch, now)
            self._beat(now)
            if now >= self._next_sample:
                self._next_sample = now + 1.0
                self.record.sent_series.append((time.time(), self.record.sent))
        self.record.sent_series.append((time.time(), self.record.sent))
        return self.record

    def _send(self, peer: Peer, msg: m.Message) -> None:
        peer.client.send(msg)
        self.record.sent += 1

    # ----- messages -------------------------------------------------------------------
    def _on_message(self, peer: Peer, msg: m.Message) -> None:
        now = time.monotonic()
        if isinstance(msg, m.Shutdown):
            self.stopped = True
        elif isinstance(msg, m.Error):
            self._error(msg.code)
        elif isinstance(msg, m.PromptBatch):
            self._latency(peer, now)
            self._seq += 1
            heapq.heappush(self.due, (now + self.args.delay_s, self._seq, peer.instance, msg))
        elif isinstance(msg, m.ScoreRequest):
            self._latency(peer, now)
            self._score(peer, msg, now)
        elif isinstance(msg, ScoreRef):
            self._latency(peer, now)
            self.refs.append((peer, msg))
        elif isinstance(msg, TrainBatchRef):
            self._latency(peer, now)
            self._fetch_batch(peer, msg)
        elif isinstance(msg, m.TrainBatch):
            self._latency(peer, now)
            tokens = int(len(msg.input_ids) - np.sum(msg.prompt_lens))
            self.record.groups.append((time.time(), len(msg.group_ids), tokens))
            peer.step = msg.step + 1
            self._ask_batch(peer, now)

    def _latency(self, peer: Peer, now: float) -> None:
        if peer.asked_at is not None:
            self.record.latencies_s.append(now - peer.asked_at)
            self.record.stamps.append(time.time())
            peer.asked_at = None

    def _answer(self, peer: Peer, batch: m.PromptBatch, now: float) -> None:
        for i in range(len(batch.group_ids)):
            msg: m.Message = self.synthetic.rollout(batch, i, peer.instance, self.args.delay_s)
            if self.store is not None and isinstance(msg, m.Rollout):
                msg = rollout_meta(msg, self.store.address, self.store.store.put(msg))
            self._send(peer, msg)
        peer.busy_s += self.args.delay_s
        peer.tokens += len(batch.group_ids) * len(self.synthetic.ids)
        self._ask_work(peer, len(batch.group_ids), now)

    def _score(self, peer: Peer, req: m.ScoreRequest, now: float) -> None:
        g = len(req.completions)
        rewards = (self.rng.random(g) < 0.5).astype(np.float32)
        self._send(
            peer,
            m.Scored(
                lease_id=req.lease_id, group_id=req.group_id, rewards=rewards,
                component_names=["sim"], components=rewards.reshape(1, g), errors=[],
            ),
        )  # fmt: skip
        self._ask_work(peer, 1, now)

    def _score_refs(self) -> None:
        """Fetch this round's ScoreRefs in one go, then score each as a ScoreRequest."""
        if self.fetcher is None:
            raise RuntimeError("a ScoreRef came to a scorer run without --payloads direct")
        refs, self.refs = self.refs, []
        got = self.fetcher.fetch([PayloadRef(r.group_id, r.source, r.digest) for _, r in refs])
        now = time.monotonic()
        for peer, ref in refs:
            request = score_request_of(ref, got.get(ref.group_id, "unreachable"),
                                       self.args.group_size)  # fmt: skip
            if isinstance(request, PayloadLost):
                self._error("payload_lost")
                self._send(peer, request)
                self._ask_work(peer, 1, now)
            else:
                self._score(peer, request, now)

    def _fetch_batch(self, peer: Peer, ref: TrainBatchRef) -> None:
        """The trainer's fetch: every group, digests checked; a loss is told and re-asked."""
        if self.fetcher is None:
            raise RuntimeError("a TrainBatchRef came to a trainer run without --payloads direct")
        got = fetch_batch(self.fetcher, ref, version=peer.step, attempt=0)
        if isinstance(got, PayloadLost):
            self._error("payload_lost")
            self._send(peer, got)
            self._ask_batch(peer, time.monotonic())
            return
        self._on_message(peer, got)

    def _error(self, code: str) -> None:
        self.record.errors[code] = self.record.errors.get(code, 0) + 1

    def _ask_work(self, peer: Peer, credits: int, now: float) -> None:
        self._send(peer, m.WorkRequest(instance=peer.instance, credits=credits))
        peer.asked_at = now

    def _ask_batch(self, peer: Peer, now: float) -> None:
        self._send(peer, m.BatchRequest(step=peer.step, trainer_version=peer.step))
        peer.asked_at = now

    def _beat(self, now: float) -> None:
        for peer in self.peers:
            if now < peer.next_beat:
                continue
            peer.next_beat = now + self.args.heartbeat_s
            stats = None
            if self.args.role == "generator" and peer.busy_s > 0:
                stats = m.GeneratorStats(
                    tokens_per_s=peer.tokens / peer.busy_s, wait_s=0.0, version=0,
                    batches=0, prompts_total=0, busy_s=peer.busy_s,
                )  # fmt: skip
            self._send(peer, m.Heartbeat(instance=peer.instance, hub_rtt_s=0.001, generator=stats))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="simulated hub peers (used by bench.hub_load)")
    p.add_argument("role", choices=["generator", "scorer", "trainer"])
    p.add_argument("hub")
    p.add_argument("secret", help="the run's secret file, or - for a hub without one")
    p.add_argument("first", type=int, help="index of this process's first peer")
    p.add_argument("count", type=int)
    p.add_argument("out", type=Path)
    p.add_argument("--stop-at", type=float, required=True, help="wall clock (time.time())")
    p.add_argument("--stop-file", type=Path, required=True, help="stop once this exists")
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--delay-s", type=float, default=0.5)
    p.add_argument("--credits", type=int, default=1)
    p.add_argument("--heartbeat-s", type=float, default=1.0)
    p.add_argument("--payloads", choices=["hub", "direct"], default="hub",
                   help="the hub's hub.payloads (direct: payloads stay here)")  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    ctx = make_context()
    names = [f"sim-{args.role}-{i}" for i in range(args.first, args.first + args.count)]
    try:
        secret = None if args.secret == "-" else load_secret(Path(args.secret))
        peers = join_all(ctx, args.hub, args.role, names, secret)
        args.out.with_suffix(".joined").touch()
        fleet = Fleet(args, peers, ctx)
        try:
            record = fleet.run(args.stop_at, args.stop_file)
        finally:
            fleet.close()
        for peer in peers:
            peer.client.close()
    finally:
        close_context(ctx)
    args.out.write_text(json.dumps(record.__dict__))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
