"""Fuzzing the two ROUTERs of a live run: the hub and the trainer's weight server.

Each socket gets FUZZ_CASES messages from a seeded generator: random bytes, truncated and
extended frames, valid headers with wrong types, huge declared sizes and shapes, wrong
protocol versions, unknown kinds and fields, and valid messages from a peer that never said
Hello. The local decoder is the oracle for which cases are malformed; the live services must
answer every case, count the malformed ones, log each rejection code at most once per 10 s,
keep their memory, and finish the run with every group accounted for. (One socket fuzzed
without a run: tests/e2e/test_fuzz_sockets.py.)
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import psutil
import pytest
import zmq

from grpo_stream.protocols import messages as m
from grpo_stream.protocols.codec import decode, encode
from grpo_stream.protocols.errors import ProtocolError
from grpo_stream.protocols.make_golden import step_stats_example

from .conftest import Run, assert_accounting, pid_of, status, weights_address

FUZZ_CASES = 10_000
STEPS = 60
SEED = 1234
RSS_SLACK = 50 * 2**20
Frames = list[bytes]


# ----- the case generator ------------------------------------------------------------------
def _samples(rng: random.Random) -> list[m.Message]:
    """One small, valid message of every kind, with fresh values (never a real instance)."""
    i32 = np.arange(rng.randint(0, 6), dtype=np.int32)
    f32 = np.linspace(0, 1, rng.randint(1, 5), dtype=np.float32)
    off = np.array([0, len(i32)], dtype=np.int64)
    gid = rng.randint(10**6, 10**9)
    who = f"fuzz-{rng.randint(0, 999)}"
    sampling = m.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=4)
    return [
        m.Hello(service="fuzzer", instance=who, host="h", pid=1, capacity=1),
        m.Welcome(run_id="r", config={}, config_digest="d", peers=None, policy_version=0),
        m.Heartbeat(instance=who, stats={"busy": True}, hub_rtt_s=0.001,
                    generator=m.GeneratorStats(1.0, 0.0, 0, 1, 1, 0.1)),
        m.WorkRequest(instance=who, credits=rng.randint(-5, 5)),
        m.PromptBatch(lease_id=1, group_ids=np.array([gid], dtype=np.int64), prompts=["p"],
                      references=[{}], group_size=2, sampling=sampling, min_version=0),
        m.Rollout(lease_id=1, group_id=gid, instance=who, policy_version=0,
                  prompt_ids=i32, completion_ids=i32, completion_offsets=off,
                  logprobs=np.zeros(len(i32), np.float32), texts=["t"], truncated=[False],
                  gen_seconds=0.1, sampling=sampling),
        m.ScoreRequest(lease_id=1, group_id=gid, prompt="p", completions=["c"], reference={}),
        m.Scored(lease_id=1, group_id=gid, rewards=f32, component_names=["r"],
                 components=f32.reshape(1, -1), errors=[]),
        m.BatchRequest(step=rng.randint(0, 3), trainer_version=0, world_size=rng.randint(1, 9)),
        m.TrainBatch(step=0, group_ids=np.array([gid], np.int64), input_ids=i32,
                     seq_offsets=off, prompt_lens=np.zeros(1, np.int32),
                     behaviour_logprobs=f32, advantages=f32, rewards=f32,
                     versions=np.zeros(1, np.int32),
                     group_offsets=np.array([0, 1], np.int64), totals=m.BatchTotals(1, len(f32)),
                     sampling=sampling, stats=step_stats_example()),
        m.WeightsAnnounce(version=1, num_tensors=1, total_bytes=4),
        m.WeightsRequest(version=rng.randint(-1, 3)),
        m.WeightsChunk(version=1, index=0, count=1, names=["w"], tensors=[f32]),
        m.StatusRequest(),
        m.Status(services=[], counters={}, policy_version=0),
        m.Error(code="x", message="y"),
        m.Shutdown(reason="fuzz"),
    ]  # fmt: skip


WRONG: list[Any] = [None, 1.5, "s", b"b", [1], {"k": [None]}, True, -1, 2**63, [[]], {"dtype": "x"}]
HUGE_HEADERS = [
    b"\x82\xa5proto\x01\xa4kind\xdb\xff\xff\xff\xffabc",  # str32 of 4 GiB, 3 bytes given
    b"\xdd\xff\xff\xff\xff\x01",  # array32 of 4 Gi items
    b"\xdf\xff\xff\xff\xff\xa1a",  # map32 of 4 Gi entries
    b"\x81\xa4kind\xc6\xff\xff\xff\xff",  # bin32 of 4 GiB
    b"\x81\xa4kind\xc9\x00\x00\x00\x10\x01",  # ext32: no ext types allowed
    b"\x91" * 5000 + b"\xc0",  # deeply nested arrays
]


def _header(frames: Frames) -> dict[str, Any]:
    head: dict[str, Any] = msgpack.unpackb(frames[0], raw=False)
    return head


def _with_header(frames: Frames, head: dict[str, Any]) -> Frames:
    return [msgpack.packb(head, use_bin_type=True), *frames[1:]]


def _mutate(rng: random.Random, frames: Frames) -> Frames:
    """One random corruption of a valid message's frames."""
    head = _header(frames)
    fields = [k for k in head if k not in ("proto", "kind")]
    arrays = [k for k in fields if isinstance(head[k], dict) and "shape" in head[k]]
    how = rng.randrange(11)
    if how == 0:  # truncated header
        return [frames[0][: rng.randrange(len(frames[0]))], *frames[1:]]
    if how == 1:  # extended header
        return [frames[0] + rng.randbytes(rng.randint(1, 8)), *frames[1:]]
    if how == 2:  # a frame too many
        return [*frames, rng.randbytes(rng.randint(0, 16))]
    if how == 3 and len(frames) > 1:  # a frame missing
        return frames[:-1]
    if how == 4 and len(frames) > 1:  # an array frame of the wrong length
        j = rng.randrange(1, len(frames))
        return [*frames[:j], frames[j] + b"\0" * rng.randint(1, 9), *frames[j + 1 :]]
    if how == 5 and arrays:  # a huge declared shape
        head[rng.choice(arrays)]["shape"] = rng.choice([[2**40, 2**40], [2**62] * 32, [-1]])
        return _with_header(frames, head)
    if how == 6:  # a wrong protocol version
        head["proto"] = rng.choice([0, 1, 2, 99, -1, "3", 3.0, None, [3]])
        return _with_header(frames, head)
    if how == 7:  # an unknown kind
        head["kind"] = rng.choice(["", "hello!", "x" * 300, 5, None])
        return _with_header(frames, head)
    if how == 8:  # an unknown field
        head["extra_" + str(rng.randrange(100))] = 1
        return _with_header(frames, head)
    if how == 9 and fields:  # a missing field
        del head[rng.choice(fields)]
        return _with_header(frames, head)
    if fields:  # a field of the wrong type
        head[rng.choice(fields)] = rng.choice(WRONG)
        return _with_header(frames, head)
    return [rng.randbytes(rng.randint(0, 64))]


def _raw(msg: m.Message) -> Frames:
    return [bytes(f) for f in encode(msg)]


@dataclass
class Case:
    frames: Frames
    code: str | None  # ProtocolError code by the local decoder; None: it decodes
    kind: str | None  # the decoded message's kind


def cases(seed: int, n: int, valid: Callable[[m.Message], bool]) -> Iterator[Case]:
    """n cases: about 1 in 10 a valid message that `valid` accepts, the rest malformed."""
    rng = random.Random(seed)
    made = 0
    while made < n:
        samples = _samples(rng)
        pick = rng.random()
        if pick < 0.1:
            frames = _raw(rng.choice(samples))
        elif pick < 0.2:
            frames = [rng.randbytes(rng.randint(0, 64)) for _ in range(rng.randint(1, 3))]
        elif pick < 0.22:
            frames = [rng.choice(HUGE_HEADERS)]
        else:
            frames = _mutate(rng, _raw(rng.choice(samples)))
        try:
            msg = decode(frames)
        except ProtocolError as exc:
            made += 1
            yield Case(frames, exc.code, None)
            continue
        if valid(msg):
            made += 1
            yield Case(frames, None, msg.KIND)


# ----- sending ---------------------------------------------------------------------------
@dataclass
class Tally:
    sent: int = 0
    replies: Counter[str] = field(default_factory=Counter)  # Error code or message kind
    seconds: float = 0.0


def fuzz(address: str, all_cases: list[Case], window: int = 64, timeout_s: float = 120) -> Tally:
    """Send every case from one DEALER, at most `window` unanswered; collect the replies."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    tally, t0 = Tally(), time.monotonic()
    deadline = t0 + timeout_s
    try:
        while sum(tally.replies.values()) < len(all_cases) and time.monotonic() < deadline:
            while tally.sent < len(all_cases) and tally.sent - sum(tally.replies.values()) < window:
                sock.send_multipart(all_cases[tally.sent].frames, flags=zmq.NOBLOCK)
                tally.sent += 1
            if sock.poll(1000):
                reply = decode(sock.recv_multipart())
                tally.replies[reply.code if isinstance(reply, m.Error) else reply.KIND] += 1
    finally:
        sock.close()
        ctx.term()
    tally.seconds = time.monotonic() - t0
    return tally


def rejection_lines(run_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for path in (run_dir / "logs").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("event") == "transport.rejected":
                rows.append(row)
    return rows


def hub_valid(msg: m.Message) -> bool:
    return not isinstance(msg, m.Hello)  # a Hello would register the fuzzer


def weights_valid(msg: m.Message) -> bool:
    return not isinstance(msg, m.WeightsRequest)  # that one streams the weights back


# ----- the live run --------------------------------------------------------------------------
@dataclass
class Fuzzed:
    run_dir: Path
    exit_code: int
    output: str
    hub: list[Case]
    weights: list[Case]
    hub_tally: Tally
    weights_tally: Tally
    rejected_before: int
    rejected_after: int
    rss: dict[str, tuple[int, int]]  # service -> (before, after)
    alive_after_fuzz: bool


def _rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    run_dir = tmp_path_factory.mktemp("fuzz") / "run"
    hub_cases = list(cases(SEED, FUZZ_CASES, hub_valid))
    weight_cases = list(cases(SEED + 1, FUZZ_CASES, weights_valid))
    # paced: the run must outlive both fuzzes; unpaced its 58 steps after step 2 took 5.7 s and
    # the weight server's fuzz ended 0.2 s after the last step (2 s before `up` exited)
    run = Run(run_dir, STEPS, "--set", "trainer.throttle_s=0.1")
    try:
        run.wait_steps(2)
        pids = {"hub": int(status(run_dir)["counters"]["hub_pid"]),
                "trainer": pid_of(run_dir, "trainer-0")}  # fmt: skip
        before = {k: _rss(p) for k, p in pids.items()}
        rejected_before = int(status(run_dir)["counters"]["rejected"])
        hub_tally = fuzz((run_dir / "hub.addr").read_text().strip(), hub_cases)
        weights_tally = fuzz(weights_address(run_dir), weight_cases)
        rejected_after = int(status(run_dir)["counters"]["rejected"])
        rss = {k: (before[k], _rss(p)) for k, p in pids.items()}
        alive = run.proc.poll() is None
        code = run.finish()
        print("fuzz:", hub_tally, weights_tally, rejected_before, rejected_after, rss)
        output = Path(run.log.name).read_text()
        yield Fuzzed(run_dir, code, output, hub_cases, weight_cases, hub_tally, weights_tally,
                     rejected_before, rejected_after, rss, alive)  # fmt: skip
    finally:
        run.kill()


@pytest.mark.slow
def test_run_completes_after_fuzzing(fuzzed: Fuzzed) -> None:
    assert fuzzed.alive_after_fuzz, "the run ended before the fuzzing did: raise STEPS"
    assert fuzzed.exit_code == 0, fuzzed.output[-3000:]


@pytest.mark.slow
def test_generator_makes_enough_malformed_cases_of_every_kind(fuzzed: Fuzzed) -> None:
    for corpus in (fuzzed.hub, fuzzed.weights):
        codes = Counter(c.code for c in corpus if c.code is not None)
        assert sum(codes.values()) >= 0.8 * FUZZ_CASES
        assert {"bad_header", "version", "unknown_kind", "bad_type", "bad_array", "frames",
                "missing_field", "unknown_field"} <= set(codes)  # fmt: skip


@pytest.mark.slow
def test_hub_answers_every_case(fuzzed: Fuzzed) -> None:
    assert fuzzed.hub_tally.sent == FUZZ_CASES
    assert sum(fuzzed.hub_tally.replies.values()) == FUZZ_CASES
    malformed = Counter(c.code for c in fuzzed.hub if c.code is not None)
    for code, n in malformed.items():
        assert fuzzed.hub_tally.replies[code] == n, code
    # a stranger's StatusRequest carries no signature with the run's status key: refused
    refused = sum(c.kind == "status_request" for c in fuzzed.hub)
    assert fuzzed.hub_tally.replies["bad_status_request"] == refused


@pytest.mark.slow
def test_hub_counts_malformed_and_unregistered_messages_as_rejected(fuzzed: Fuzzed) -> None:
    malformed = sum(c.code is not None for c in fuzzed.hub)
    # a valid message from a stranger is refused (a StatusRequest too: it is not signed)
    unregistered = sum(c.kind is not None for c in fuzzed.hub)
    assert fuzzed.rejected_after - fuzzed.rejected_before == malformed + unregistered


@pytest.mark.slow
def test_weight_server_answers_every_case_with_an_error(fuzzed: Fuzzed) -> None:
    tally = fuzzed.weights_tally
    assert sum(tally.replies.values()) == FUZZ_CASES
    malformed = Counter(c.code for c in fuzzed.weights if c.code is not None)
    for code, n in malformed.items():
        assert tally.replies[code] == n, code
    assert tally.replies["unexpected"] == sum(c.code is None for c in fuzzed.weights)


@pytest.mark.slow
def test_rejections_are_logged_at_most_once_per_code_per_10_s(fuzzed: Fuzzed) -> None:
    lines = rejection_lines(fuzzed.run_dir)
    last: dict[tuple[str, str, str], float] = {}
    for row in sorted(lines, key=lambda r: float(r["t"])):
        key = (row["instance"], row["socket"], row["code"])
        if key in last:
            assert float(row["t"]) - last[key] >= 9.9, row
        last[key] = float(row["t"])
    for socket, corpus in (("hub", fuzzed.hub), ("weights", fuzzed.weights)):
        codes = {c.code for c in corpus if c.code is not None}
        assert codes <= {r["code"] for r in lines if r["socket"] == socket}


@pytest.mark.slow
def test_memory_of_hub_and_trainer_stays_bounded(fuzzed: Fuzzed) -> None:
    for service, (before, after) in fuzzed.rss.items():
        assert after - before < RSS_SLACK, (service, before, after)


@pytest.mark.slow
def test_every_group_is_accounted_for_after_fuzzing(fuzzed: Fuzzed) -> None:
    assert_accounting(fuzzed.run_dir, STEPS)
