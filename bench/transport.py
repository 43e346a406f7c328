"""Transport benchmark: TrainBatch-sized messages through the codec vs the same bytes raw.

A sender process (this script with `--role sender`, as a hub would be) pushes N messages
over ZeroMQ PUSH/PULL on tcp://127.0.0.1 to this process (as a trainer would receive
them). `codec`: the sender encodes a TrainBatch for every message and the receiver decodes
every one. `raw`: the sender sends the same frames, encoded once up front, and the
receiver does not decode. Short rounds alternate between the modes so both see the same
machine load; each mode's throughput is its messages over its total time.
The last line printed is `ratio codec/raw: X` (codec throughput over raw; goal >= 0.8).

Run: python bench/transport.py [--iters 1000] [--seqs 256] [--tokens 1024] [--rounds 50]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
import zmq

from grpo_stream.protocols import TrainBatch, decode, encode

POLL_MS = 30_000  # a sender silent this long has died: fail instead of hanging


def make_batch(seqs: int, tokens: int) -> TrainBatch:
    """S sequences of `tokens` tokens; the first quarter of each is prompt."""
    prompt = tokens // 4
    rng = np.random.default_rng(0)
    return TrainBatch(
        step=1,
        group_ids=np.arange(max(seqs // 8, 1), dtype=np.int64),
        input_ids=rng.integers(0, 32_000, seqs * tokens, dtype=np.int32),  # (S*T,)
        seq_offsets=np.arange(0, seqs * tokens + 1, tokens, dtype=np.int64),  # (S+1,)
        prompt_lens=np.full(seqs, prompt, dtype=np.int32),  # (S,)
        behaviour_logprobs=-rng.random(seqs * (tokens - prompt), dtype=np.float32),
        advantages=rng.standard_normal(seqs, dtype=np.float32),  # (S,)
        rewards=rng.random(seqs, dtype=np.float32),  # (S,)
        versions=np.zeros(seqs, dtype=np.int32),  # (S,)
        stats={"dropped_stale": 0},
    )


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
            assert isinstance(command, dict)
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
            *(sys.executable, __file__, "--role", "sender"),
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
    args = parser.parse_args(argv)
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
