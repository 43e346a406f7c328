"""Hostile peers for the trust tests, each a real ZeroMQ client of a live run's hub: a
stranger with a raw socket, and a rogue generator that holds the run's secret (a compromised
generator) and answers its leases with crafted Rollouts."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import zmq

from grpo_stream.config import config_from_dict
from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.hub.auth import load_secret, session_key, sign
from grpo_stream.models.loading import load_tokenizer
from grpo_stream.protocols import messages as m
from grpo_stream.protocols.codec import decode, encode
from grpo_stream.tasks import make_task
from grpo_stream.transport.seal import MAIN, Sealer
from grpo_stream.transport.sockets import Client, close_context, handshake, make_context

Attack = Callable[["Rogue", m.PromptBatch, int], list[bytes]]


def ask_raw(address: str, msgs: list[m.Message], identity: str = "", wait_ms: int = 3000
            ) -> list[m.Message | None]:  # fmt: skip
    """Each message on one plain stranger connection; the hub's reply to each (None: none)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if identity:
        sock.setsockopt(zmq.IDENTITY, identity.encode())
    sock.connect(address)
    replies: list[m.Message | None] = []
    try:
        for msg in msgs:
            sock.send_multipart([bytes(f) for f in encode(msg)])
            replies.append(decode(sock.recv_multipart()) if sock.poll(wait_ms) else None)
    finally:
        sock.close()
        ctx.term()
    return replies


@dataclass
class Rogue:
    """A generator with the run's secret: a signed Hello, a sealed session, credits; every
    Rollout it sends is one of `attacks` (in turn), each a lie the hub must refuse."""

    run_dir: Path
    attacks: list[tuple[str, Attack]]
    instance: str = "rogue-gen"
    replies: list[tuple[str, m.Message]] = field(default_factory=list)  # (attack, answer)
    sent: list[str] = field(default_factory=list)  # the attack of each Rollout sent
    tokenizer: Any = None
    client: Client | None = None

    def __post_init__(self) -> None:
        self.ctx = make_context()
        self.tokenizer = load_tokenizer("grpo-stream/tiny-arith")
        self.secret = load_secret(self.run_dir / "secret")

    def join(self) -> m.Welcome:
        address = (self.run_dir / "hub.addr").read_text().strip()
        identity = f"{self.instance}.{os.getpid()}"
        self.client = Client(self.ctx, address, TransportSettings(), SecuritySettings(), identity)
        welcome = handshake(self.client, self.hello(""), 30.0, self.hello)
        self.task = make_task(config_from_dict(dict(welcome.config)).task)
        return welcome

    def hello(self, challenge: str) -> m.Hello:
        """A Hello signed for the hub's `challenge`; what follows it is sealed with its key."""
        assert self.client is not None
        hello = m.Hello("generator", self.instance, socket.gethostname(), os.getpid(), 4)
        sign(hello, self.secret, challenge)
        self.client.sealer = Sealer(session_key(self.secret, hello), MAIN)
        return hello

    def play(self, rollouts: int, timeout_s: float = 90.0, replies: bool = True) -> None:
        """Ask for work and answer `rollouts` prompts with attacks, the rest of a batch's
        prompts honestly; collect every answer (`replies`: wait for one per attack)."""
        client = self.client
        assert client is not None
        client.send(m.WorkRequest(instance=self.instance, credits=4))
        deadline = time.monotonic() + timeout_s
        waiting = replies
        while (len(self.sent) < rollouts or (waiting and len(self.replies) < len(self.sent))) and (
            time.monotonic() < deadline
        ):
            msg = client.recv(200)
            if isinstance(msg, m.PromptBatch) and len(self.sent) < rollouts:
                for i in range(len(msg.group_ids)):
                    if len(self.sent) < rollouts:
                        name, attack = self.attacks[len(self.sent) % len(self.attacks)]
                        self.sent.append(name)
                        self._send(attack(self, msg, i))
                    else:  # what it leased beyond its attacks: answered, not left to expire
                        self._send(frames(self.honest(msg, i)))
                if len(self.sent) < rollouts:
                    client.send(m.WorkRequest(instance=self.instance, credits=len(msg.group_ids)))
            elif isinstance(msg, m.Error) and msg.in_reply_to == "rollout":
                self.replies.append((self.sent[len(self.replies)], msg))

    def _send(self, raw: list[bytes]) -> None:
        client = self.client
        assert client is not None and client.sealer is not None
        client.socket.send_multipart([client.sealer.seal(raw), *raw])

    def close(self) -> None:
        if self.client is not None:
            self.client.send(m.Shutdown(reason="done"))
            self.client.close()
        close_context(self.ctx)

    # ----- an honest Rollout, then the lies --------------------------------------------
    def honest(self, batch: m.PromptBatch, i: int) -> m.Rollout:
        """What an honest hf generator would send for prompt i of `batch` (short answers)."""
        tok = self.tokenizer
        gid = int(batch.group_ids[i])
        rows = [tok("1")["input_ids"][-1:] for _ in range(batch.group_size)]
        ids = [t for r in rows for t in r]
        offsets = np.cumsum([0, *[len(r) for r in rows]]).astype(np.int64)
        return m.Rollout(
            lease_id=batch.lease_id, group_id=gid, instance=self.instance,
            policy_version=batch.min_version,
            prompt_ids=np.array(tok(batch.prompts[i])["input_ids"], np.int32),
            completion_ids=np.array(ids, np.int32), completion_offsets=offsets,
            logprobs=np.full(len(ids), -0.5, np.float32),
            texts=[tok.decode(r, skip_special_tokens=True) for r in rows],
            truncated=[False] * len(rows), gen_seconds=0.01, sampling=batch.sampling,
        )  # fmt: skip


def frames(msg: m.Message) -> list[bytes]:
    return [bytes(f) for f in encode(msg)]


def texts_not_ids(rogue: Rogue, batch: m.PromptBatch, i: int) -> list[bytes]:
    """Scored on one text, trained on other tokens: the texts claim the right answer."""
    ro = rogue.honest(batch, i)
    answer = str(rogue.task.problem(ro.group_id).reference.get("answer", "42"))
    ro.texts = [answer] * len(ro.texts)
    return frames(ro)


def out_of_vocabulary(rogue: Rogue, batch: m.PromptBatch, i: int) -> list[bytes]:
    """One token id of 10**6: it crashed the trainer."""
    ro = rogue.honest(batch, i)
    ids = np.array(ro.completion_ids)
    ids[-1] = 10**6
    ro.completion_ids = ids
    return frames(ro)


def other_prompt(rogue: Rogue, batch: m.PromptBatch, i: int) -> list[bytes]:
    """Trained as the answer to another prompt than the one scored."""
    ro = rogue.honest(batch, i)
    ro.prompt_ids = np.array(rogue.tokenizer("9+9=")["input_ids"], np.int32)
    return frames(ro)


def not_its_lease(rogue: Rogue, batch: m.PromptBatch, i: int) -> list[bytes]:
    """A result under a lease it was never given (another generator's work)."""
    ro = rogue.honest(batch, i)
    ro.lease_id = batch.lease_id + 10_000
    return frames(ro)


def own_reference(rogue: Rogue, batch: m.PromptBatch, i: int) -> list[bytes]:
    """A Rollout carrying its own reference answer for the scorer (the wire as before v6)."""
    head, *arrays = frames(rogue.honest(batch, i))
    header = msgpack.unpackb(head, raw=False)
    header["reference"] = {"answer": "the rogue's"}
    return [msgpack.packb(header, use_bin_type=True), *arrays]


HUB_ATTACKS: list[tuple[str, Attack]] = [
    ("texts_not_ids", texts_not_ids),
    ("out_of_vocabulary", out_of_vocabulary),
    ("other_prompt", other_prompt),
    ("not_its_lease", not_its_lease),
    ("own_reference", own_reference),
]
EXPECTED = {
    "texts_not_ids": "bad_content",
    "out_of_vocabulary": "bad_content",
    "other_prompt": "bad_content",
    "not_its_lease": "bad_lease",
    "own_reference": "unknown_field",
}
