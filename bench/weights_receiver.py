"""One receiver of `python -m bench.weights` (a generator's part): follows the trainer's
announcements with a real `WeightsWatcher`, fetches each announced version with a real
`Replica` (optionally relaying it to other receivers), applies it and reports the probe and
the times to the benchmark's PULL socket. Started by bench.weights with its own arguments
(`python -m bench.weights_receiver ...`, the same parser); not meant to be run by hand.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.weights import REPORT_TIMEOUT_S, build_parser, transport_settings, weights_settings
from bench.weights_set import probe, shapes_of


class SyntheticTarget:
    """Preallocated arrays (the wire dtype) that a received version is copied into."""

    def __init__(self, shapes: list[tuple[str, tuple[int, ...]]], dtype: str) -> None:
        import numpy as np

        from grpo_stream.protocols.arrays import wire_dtypes

        wire = wire_dtypes()["bfloat16" if dtype == "bf16" else "float32"]
        self.arrays = {name: np.zeros(shape, dtype=wire) for name, shape in shapes}

    def apply(self, named: list[tuple[str, Any]], version: int) -> float:
        """Check names and shapes of the whole version, then copy; returns the probe."""
        import numpy as np

        if {n for n, _ in named} != set(self.arrays):
            raise ValueError(f"version {version}: names differ from the preallocated set")
        for name, src in named:
            if tuple(src.shape) != self.arrays[name].shape:
                raise ValueError(f"version {version}: {name} has shape {tuple(src.shape)}")
        for name, src in named:
            np.copyto(self.arrays[name], src)
        return float(sum(float(a.reshape(-1)[0]) for a in self.arrays.values() if a.size))


class ModelTarget:
    """A tiny-model HFEngine; a version is applied with `load_weights`."""

    def __init__(self, model_path: str) -> None:
        from grpo_stream.engines.hf import HFEngine
        from grpo_stream.models.loading import load_policy, load_tokenizer

        policy = load_policy(model_path, dtype="float32", trainable=False)
        self.engine = HFEngine(policy, load_tokenizer(model_path))

    def apply(self, named: list[tuple[str, Any]], version: int) -> float:
        self.engine.load_weights(named, version)
        return probe(list(self.engine.model.parameters()))


def run_receiver(args: argparse.Namespace) -> None:
    """Follow announcements; fetch, apply and report each new version until the last."""
    import zmq

    from grpo_stream.config.transport import SecuritySettings
    from grpo_stream.transport.fetch import Replica, WeightsWatcher
    from grpo_stream.transport.relay import Relay

    transport, security = transport_settings(args), SecuritySettings()
    weights = weights_settings(args)
    target: SyntheticTarget | ModelTarget
    if args.kind == "synthetic":
        target = SyntheticTarget(shapes_of(args), args.dtype)
    else:
        target = ModelTarget(args.model)
    ctx: zmq.Context[Any] = zmq.Context()
    watcher = WeightsWatcher(ctx, args.announce, transport, security)
    relay = None
    if args.relay:
        relay = Relay(ctx, "tcp://127.0.0.1:0", transport, security, weights.relay_stall_s)
    replica = Replica()
    report = ctx.socket(zmq.PUSH)
    report.setsockopt(zmq.LINGER, 5000)  # the last report must reach the benchmark before exit
    report.connect(args.report)
    try:
        report.send_json({"ready": args.index})
        applied, idle_since = -1, time.monotonic()
        while applied < args.rounds and time.monotonic() - idle_since < REPORT_TIMEOUT_S:
            version = watcher.poll(200)
            if version is None or version == applied:
                continue
            t_seen, cpu_seen = time.time(), time.process_time()
            got = replica.fetch(
                ctx, args.weights, transport, security, version, weights=weights, relay=relay
            )
            t_fetched, cpu_fetched = time.time(), time.process_time()
            value = target.apply(replica.named(), got)
            t_applied, cpu_applied = time.time(), time.process_time()
            applied, idle_since = got, time.monotonic()
            report.send_json(
                {"index": args.index, "version": got, "probe": value, "t_seen": t_seen,
                 "t_fetched": t_fetched, "t_applied": t_applied,
                 "cpu_fetch_s": cpu_fetched - cpu_seen, "cpu_apply_s": cpu_applied - cpu_fetched}
            )  # fmt: skip
        while relay is not None:  # keep relaying to late children until the benchmark ends us
            time.sleep(0.5)
    finally:
        if relay is not None:
            relay.close()
        watcher.close()
        report.close()
        ctx.term()


def main(argv: list[str] | None = None) -> None:
    run_receiver(build_parser().parse_args(argv))


if __name__ == "__main__":
    main()
