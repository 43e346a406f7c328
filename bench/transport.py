"""Transport benchmark: TrainBatch-sized messages through the codec vs the same bytes raw.

A sender process (this script with `--role sender`, as a hub would be) pushes N messages
over ZeroMQ PUSH/PULL on tcp://127.0.0.1 to this process (as a trainer would receive
them). `codec`: the sender encodes a TrainBatch for every message and the receiver decodes
every one. `raw`: the sender sends the same frames, encoded once up front, and the
receiver does not decode. Short rounds alternate between the modes so both see the same
machine load; each mode's throughput is its messages over its total time.
The last line printed is `ratio codec/raw: X` (codec throughput over raw; goal >= 0.8).

Run: python -m bench.transport [--iters 1000] [--seqs 256] [--tokens 1024] [--rounds 50]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
import zmq

from bench.common import add_smoke, parse
from grpo_stream.hub.batches import build_batch
from grpo_stream.hub.replay import Group
from grpo_stream.protocols import SamplingParams, TrainBatch, decode, encode

POLL_MS = 30_000  # a sender silent this long has died: fail instead of hanging


GROUP = 8


def make_batch(seqs: int, tokens: int) -> TrainBatch:
    """S sequences of `tokens` tokens in groups of 8 (the first quarter of each is prompt),
    built by the hub's own `build_batch`, so the message stays today's TrainBatch."""
    prompt = max(tokens // 4, 1)
    rng = np.random.default_rng(0)
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=tokens - prompt)
    groups = []
    for g in range(max(seqs // GROUP, 1)):
        n = min(GROUP, seqs - g * GROUP) if seqs >= GROUP else seqs
        completion = tokens - prompt
        rewards = rng.random(n, dtype=np.float32)
        groups.append(
            Group(
                group_id=g,
                policy_version=0,
                prompt_ids=rng.integers(0, 32_000, prompt, dtype=np.int32),
                completion_ids=rng.integers(0, 32_000, n * completion, dtype=np.int32),
                completion_offsets=np.arange(0, n * completion + 1, completion, dtype=np.int64),
                logprobs=-rng.random(n * completion, dtype=np.float32),
                rewards=rewards,
                advantages=(rewards - rewards.mean()).astype(np.float32),
                valid=np.ones(n, dtype=bool),
                sampling=sampling,
            )
        )
    return build_batch(1, groups)


def _socket(ctx: zmq.Context[zmq.Socket[bytes]], kind: int) -> zmq.Socket[bytes]:
    sock = ctx.socket(kind)
    # A small HWM bounds memory to a few messages in flight, as in the services.
    sock.setsockopt(zmq.SNDHWM, 8)
    sock.setsockopt(zmq.RCVHWM, 8)
    # Every message is received before close, so nothing is lost by not lingering.
    sock.setsockopt(zmq.LINGER, 0)
    return sock


def run_sender(data: str, control: str, seqs: int, tokens: int) -> None:
    """Send `iters` messages in the mode each control command names, until `stop`."""
    batch = make_batch(seqs, tokens)
    raw = encode(batch)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    push, ctrl = _socket(ctx, zmq.PUSH), _socket(ctx, zmq.PAIR)
    push.connect(data)
    ctrl.connect(control)
    try:
        while True:
            command = ctrl.recv_json()
            if not isinstance(command, dict):
                raise TypeError(f"the control socket sent {command!r}")
            if command["mode"] == "stop":
                return
            for _ in range(int(command["iters"])):
                frames = encode(batch) if command["mode"] == "codec" else raw
                push.send_multipart(frames, copy=False)
    finally:
        push.close()
        ctrl.close()
        ctx.term()


def timed_round(
    pull: zmq.Socket[bytes],
    ctrl: zmq.Socket[bytes],
    mode: str,
    iters: int,
    consume: Callable[[list[zmq.Frame]], object],
) -> float:
    """Seconds from the command to the last message consumed."""
    start = time.perf_counter()
    ctrl.send_json({"mode": mode, "iters": iters})
    for _ in range(iters):
        if not pull.poll(POLL_MS):
            raise RuntimeError(f"no message from the sender within {POLL_MS / 1000:.0f} s")
        consume(pull.recv_multipart(copy=False))
    return time.perf_counter() - start


def codec_cost(batch: TrainBatch, reps: int = 200) -> tuple[float, float]:
    """Microseconds per encode and per decode (no sockets)."""
    frames = [bytes(f) for f in encode(batch)]
    start = time.perf_counter()
    for _ in range(reps):
        encode(batch)
    mid = time.perf_counter()
    for _ in range(reps):
        decode(frames)
    end = time.perf_counter()
    return (mid - start) / reps * 1e6, (end - mid) / reps * 1e6


def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    """Round times per mode, with the sender in a child process (tracked by pid)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pull, ctrl = _socket(ctx, zmq.PULL), _socket(ctx, zmq.PAIR)
    data_port = pull.bind_to_random_port("tcp://127.0.0.1")
    ctrl_port = ctrl.bind_to_random_port("tcp://127.0.0.1")
    sender = subprocess.Popen(
        [
            *(sys.executable, "-m", "bench.transport", "--role", "sender"),
            *("--seqs", str(args.seqs), "--tokens", str(args.tokens)),
            *("--data", f"tcp://127.0.0.1:{data_port}"),
            *("--control", f"tcp://127.0.0.1:{ctrl_port}"),
        ]
    )
    consumers: dict[str, Callable[[list[zmq.Frame]], object]] = {"codec": decode, "raw": len}
    times: dict[str, list[float]] = {mode: [] for mode in consumers}
    try:
        for mode, consume in consumers.items():  # warm-up: connect and first touch
            timed_round(pull, ctrl, mode, 3, consume)
        per_round = max(args.iters // args.rounds, 1)
        for _ in range(args.rounds):
            for mode, consume in consumers.items():
                times[mode].append(timed_round(pull, ctrl, mode, per_round, consume))
        ctrl.send_json({"mode": "stop"})
        sender.wait(timeout=30)
    finally:
        if sender.poll() is None:
            sender.kill()
            sender.wait()
        pull.close()
        ctrl.close()
        ctx.term()
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="codec vs raw ZeroMQ throughput")
    parser.add_argument("--iters", type=int, default=1000, help="messages per mode")
    parser.add_argument("--seqs", type=int, default=256, help="sequences per TrainBatch")
    parser.add_argument("--tokens", type=int, default=1024, help="tokens per sequence")
    parser.add_argument("--rounds", type=int, default=50, help="alternations of the modes")
    parser.add_argument("--role", choices=["main", "sender"], default="main", help="internal")
    parser.add_argument("--data", help="internal: sender's data address")
    parser.add_argument("--control", help="internal: sender's control address")
    add_smoke(parser)
    args = parse(parser, argv, ["--iters", "20", "--rounds", "2", "--seqs", "16", "--tokens", "64"])
    if args.role == "sender":
        run_sender(args.data, args.control, args.seqs, args.tokens)
        return

    batch = make_batch(args.seqs, args.tokens)
    frames = encode(batch)
    size = sum(memoryview(f).nbytes for f in frames)
    shape = f"{args.seqs} seqs x {args.tokens} tokens"
    print(f"message: {shape}, {size / 1e6:.2f} MB in {len(frames)} frames")
    enc_us, dec_us = codec_cost(batch)
    print(f"codec cost: encode {enc_us:.1f} us, decode {dec_us:.1f} us per message")
    rate = {}
    per_round = max(args.iters // args.rounds, 1)
    for mode, secs in measure(args).items():
        rate[mode] = per_round * len(secs) / sum(secs)
        mb_s = rate[mode] * size / 1e6
        spread = f"rounds {min(secs) * 1e3:.0f}-{max(secs) * 1e3:.0f} ms"
        print(f"{mode:5s}: {mb_s:9.1f} MB/s {rate[mode]:8.1f} msgs/s ({spread})")
    print(f"ratio codec/raw: {rate['codec'] / rate['raw']:.2f}")


if __name__ == "__main__":
    main()
