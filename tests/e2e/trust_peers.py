"""Hostile peers for the trust tests, each a real ZeroMQ client of a live run's hub: a
stranger with a raw socket, a rogue generator that holds the run's secret (a compromised
generator) and answers its leases with crafted Rollouts (episodes too, played against the
real environment), and a recording of a member's session as a stranger on the network
would capture it."""

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

from grpo_stream.config import load_config
from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.envs.episodes import EpisodeRun, run_episodes
from grpo_stream.envs.local import LocalEnvs
from grpo_stream.envs.registry import env_factory
from grpo_stream.envs.service import episode_rollout
from grpo_stream.envs.turns import TurnFormat
from grpo_stream.hub.auth import load_secret, session_key, sign
from grpo_stream.models.loading import load_tokenizer
from grpo_stream.protocols import messages as m
from grpo_stream.protocols.codec import decode, encode
from grpo_stream.sampling import Completion, Sampling
from grpo_stream.securitycheck import ask
from grpo_stream.tasks import make_task
from grpo_stream.transport.seal import MAIN, Sealer
from grpo_stream.transport.sockets import Client, close_context, handshake, make_context

Attack = Callable[["Rogue", m.PromptBatch, int], list[bytes]]
BEAT_S = 0.5
"""How often a rogue generator beats (the e2e runs declare a peer lost after 3 s)."""


ask_raw = ask
"""Each message on one plain stranger connection; the hub's reply to each (None: none): the
security check's own stranger socket (`grpo_stream.securitycheck.ask`)."""


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
    next_beat: float = 0.0

    def __post_init__(self) -> None:
        self.ctx = make_context()
        self.secret = load_secret(self.run_dir / "secret")
        # before joining: loading takes seconds, and a silent peer is declared lost
        self.cfg = load_config(self.run_dir / "config.toml")
        self.tokenizer = load_tokenizer(self.cfg.model.name_or_path)
        self.task = make_task(self.cfg.task, tokenizer=self.tokenizer)

    def join(self) -> m.Welcome:
        address = (self.run_dir / "hub.addr").read_text().strip()
        identity = f"{self.instance}.{os.getpid()}"
        self.client = Client(self.ctx, address, TransportSettings(), SecuritySettings(), identity)
        return handshake(self.client, self.hello(""), 30.0, self.hello)

    def hello(self, challenge: str) -> m.Hello:
        """A Hello signed for the hub's `challenge`; what follows it is sealed with its key."""
        assert self.client is not None
        hello = m.Hello("generator", self.instance, socket.gethostname(), os.getpid(), 4)
        sign(hello, self.secret, challenge)
        self.client.sealer = Sealer(session_key(self.secret, hello), MAIN)
        return hello

    def play(self, rollouts: int, timeout_s: float = 180.0, replies: bool = True) -> None:
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
            msg = self._recv()
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
                name = self.sent[len(self.replies)] if len(self.replies) < len(self.sent) else ""
                self.replies.append((name, msg))  # "": an honest leftover refused

    def offered(self, seconds: float) -> list[m.Message]:
        """Ask for work again; what the hub sends in `seconds`."""
        client = self.client
        assert client is not None
        client.send(m.WorkRequest(instance=self.instance, credits=4))
        got: list[m.Message] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            msg = self._recv()
            if msg is not None:
                got.append(msg)
        return got

    def _recv(self) -> m.Message | None:
        """The next message within 200 ms; a sealed heartbeat first when one is due (alive
        as a generator is, however long a lease takes to come on a loaded machine)."""
        if time.monotonic() >= self.next_beat:
            self.next_beat = time.monotonic() + BEAT_S
            self._send(frames(m.Heartbeat(instance=self.instance)))
        assert self.client is not None
        return self.client.recv(200)

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
        """What an honest hf generator would send for prompt i of `batch` (short answers;
        an episode run: episodes played against the run's own environment)."""
        if self.cfg.env.enabled:
            return self.episodes(batch, i)
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

    def episodes(self, batch: m.PromptBatch, i: int) -> m.Rollout:
        """G episodes of prompt i, the policy always guessing 8 then 12 (the environment
        answers for real: `LocalEnvs` of the run's environment)."""
        env, gid = self.cfg.env, int(batch.group_ids[i])
        fmt = TurnFormat(self.tokenizer, self.cfg.task.chat_template, env.format)
        prompt, reference, g = batch.prompts[i], dict(batch.references[i]), batch.group_size
        run = EpisodeRun([prompt], [reference], g, Sampling(batch.sampling.max_tokens, seed=0))
        script = Script(self.tokenizer, ["8", "12", "10", "11", "9", "13"])
        played = run_episodes(script, self.tokenizer, LocalEnvs(env_factory(env)), fmt, env, run)
        ids, offsets, logprobs = np.zeros(0, np.int32), np.zeros(1, np.int64), np.zeros(0)
        version, sampling = batch.min_version, batch.sampling
        head = m.Rollout(
            batch.lease_id,
            gid,
            self.instance,
            version,
            ids,
            ids,
            offsets,
            logprobs.astype(np.float32),
            [],
            [],
            0.01,
            sampling,
        )
        return episode_rollout(head, played[0])


@dataclass
class Script:
    """A policy that says `replies[t]` at turn t, each ended with <eos> (the turn: the <eos>
    in the row so far)."""

    tokenizer: Any
    replies: list[str]

    def open_turns(self) -> Script:
        return self

    def close(self) -> None:
        pass

    def complete(
        self, keys: list[int], rows: list[list[int]], sampling: Sampling
    ) -> list[Completion]:
        max_tokens, eos = sampling.max_tokens, self.tokenizer.eos_token_id
        out = []
        for row in rows:
            text = self.replies[min(row.count(eos), len(self.replies) - 1)]
            ids = [*self.tokenizer(text, add_special_tokens=False)["input_ids"], eos]
            kept = ids[:max_tokens]
            out.append(Completion(kept, [-0.5] * len(kept), text, len(ids) > max_tokens))
        return out


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


def episode_fields(rogue: Rogue, batch: m.PromptBatch, i: int) -> list[bytes]:
    """An ordinary prompt sent as an episode, its own rewards in it: the wrong answer "1"
    rewarded 1.0 (what trained 12 of 12 such groups on an arithmetic run)."""
    ro = rogue.honest(batch, i)
    g, n = len(ro.texts), len(ro.completion_ids)
    rewards = np.zeros(g, np.float32)
    rewards[0] = 1.0
    ro.loss_mask = np.ones(n, np.uint8)
    ro.episode_rewards, ro.turn_rewards = rewards, rewards.copy()
    ro.turn_starts = np.zeros(g, np.int64)
    ro.turn_offsets = np.arange(g + 1, dtype=np.int64)
    return frames(ro)


def nan_logprobs(rogue: Rogue, batch: m.PromptBatch, i: int) -> list[bytes]:
    """Behaviour log-probs that are NaN: 12 such groups made the trainer roll back 7 times."""
    ro = rogue.honest(batch, i)
    ro.logprobs = np.full(len(ro.completion_ids), np.nan, np.float32)
    return frames(ro)


def lying_rewards(rogue: Rogue, batch: m.PromptBatch, i: int) -> list[bytes]:
    """Honest episodes claiming a reward of 100 each (an episode run)."""
    ro = rogue.honest(batch, i)
    ro.episode_rewards = np.full(len(ro.texts), 100.0, np.float32)
    ro.turn_rewards = np.full(len(ro.turn_rewards), 100.0, np.float32)
    return frames(ro)


def forged_turn(rogue: Rogue, batch: m.PromptBatch, i: int) -> list[bytes]:
    """Honest episodes but for the environment's first answer, replaced by "higher 1-16:"
    cut to its length (an episode run): the context the policy is trained in, forged."""
    ro = rogue.honest(batch, i)
    mask = np.asarray(ro.loss_mask).tolist()
    start = mask.index(0)  # the first environment turn: up to the next sampled token
    end = mask.index(1, start) if 1 in mask[start:] else len(mask)
    fake = rogue.tokenizer("higher 1-16:", add_special_tokens=False)["input_ids"]
    ids = np.array(ro.completion_ids)
    ids[start:end] = (fake * (end - start))[: end - start]
    ro.completion_ids = ids
    return frames(ro)


HUB_ATTACKS: list[tuple[str, Attack]] = [
    ("texts_not_ids", texts_not_ids),
    ("out_of_vocabulary", out_of_vocabulary),
    ("other_prompt", other_prompt),
    ("not_its_lease", not_its_lease),
    ("own_reference", own_reference),
    ("episode_fields", episode_fields),
]
EXPECTED = {
    "texts_not_ids": "bad_content",
    "out_of_vocabulary": "bad_content",
    "other_prompt": "bad_content",
    "not_its_lease": "bad_lease",
    "own_reference": "unknown_field",
    "episode_fields": "bad_rollout",
}


def record_member(address: str, secret: bytes, instance: str = "rec-scorer") -> list[list[bytes]]:
    """A scorer with the run's secret joins and says three sealed things; every frame it sent
    after its challenge, as a stranger on the network records them (it then leaves)."""
    ctx = make_context()
    identity = f"{instance}.{os.getpid()}"
    client = Client(ctx, address, TransportSettings(), SecuritySettings(), identity)
    recorded: list[list[bytes]] = []

    def hello(challenge: str) -> m.Hello:
        msg = m.Hello("scorer", instance, socket.gethostname(), os.getpid(), 1)
        sign(msg, secret, challenge)
        client.sealer = Sealer(session_key(secret, msg), MAIN)
        recorded[:] = [frames(msg)]  # the Hello the hub took
        return msg

    try:
        handshake(client, hello(""), 30.0, hello)
        for _ in range(3):
            raw = frames(m.WorkRequest(instance=instance, credits=0))
            assert client.sealer is not None
            recorded.append([client.sealer.seal(raw), *raw])
            client.socket.send_multipart(recorded[-1])
        client.send(m.Shutdown(reason="done"))
    finally:
        client.close()
        close_context(ctx)
    return recorded


def replay(address: str, recorded: list[list[bytes]], identity: str) -> list[m.Message | None]:
    """Each recorded message again, from a stranger's socket under the recorded identity;
    the hub's answer to each (None: none within 3 s)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, identity.encode())
    sock.connect(address)
    answers: list[m.Message | None] = []
    try:
        for raw in recorded:
            sock.send_multipart(raw)
            answers.append(decode(sock.recv_multipart()) if sock.poll(3000) else None)
    finally:
        sock.close()
        ctx.term()
    return answers
