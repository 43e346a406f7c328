"""bench.vllm_stream's in-flight part: the stream side with a stand-in trainer, versions
applied between requests (`between`: pause mode "wait") or in flight (`inflight`: "keep",
KV recomputed), the two modes alternating on one engine.

The trainer is a thread, not a real optimiser (that would take the generator's cores): per
step it waits until `--groups-per-step` groups arrived (its wait), sleeps `--train-s`, then
publishes a new version (the model's weights plus small noise: real bytes through a real
WeightServer, announced) and raises the hub's min_version to it, so no PromptBatch waits on
more than one version of staleness. Measured per mode: seconds generation was paused per
update (the engine's pause to resume; "wait" includes letting running requests finish),
trainer wait per step, and staleness of trained tokens (the trainer's version when it took a
group minus the version that sampled each token), and the share of groups sampled by two
versions.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from bench.vllm_stream_parts import BenchHub, run_config, serve, workload
from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.protocols import messages as m

MODES = ("between", "inflight")
INFLIGHT_CREDITS = 16
"""The generator's credits in this part unless --prompts-per-request says: fixed, so the
requests an update pauses are as many as before credits followed the engine."""


class StandInTrainer:
    """Consumes groups, publishes a version per `groups_per_step` (see module docstring)."""

    def __init__(self, server: Any, weights: list[tuple[str, Any]], args: argparse.Namespace,
                 first_version: int) -> None:  # fmt: skip
        self.server = server
        self.weights = weights
        self.args = args
        self.version = first_version
        self.waits: list[float] = []
        self.token_age = 0  # sum over trained tokens of (trainer version - token version)
        self.tokens = 0
        self.mixed = 0
        self.groups = 0

    def run(self, hub: BenchHub) -> None:
        import torch

        for _ in range(self.args.steps):
            t0 = time.perf_counter()
            for _ in range(self.args.groups_per_step):
                self._take(hub.on_rollout.get(timeout=600))
            self.waits.append(time.perf_counter() - t0)
            time.sleep(self.args.train_s)
            self.version += 1
            noise = torch.Generator().manual_seed(self.version)
            with torch.no_grad():
                named = [(n, p + 1e-3 * torch.randn(p.shape, generator=noise))
                         for n, p in self.weights]  # fmt: skip
            self.server.publish(self.version, named)
            hub.min_version = self.version - 1

    def _take(self, rollout: Any) -> None:
        ids = len(rollout.completion_ids)
        starts = list(rollout.token_version_starts) or [0]
        versions = list(rollout.token_versions) or [rollout.policy_version]
        ends = [*starts[1:], ids]
        for start, end, v in zip(starts, ends, versions, strict=True):
            self.token_age += (end - start) * (self.version - int(v))
        self.tokens += ids
        self.groups += 1
        self.mixed += len(set(versions)) > 1


def settle(engine: Any) -> None:
    """Wait for a background update still running on the engine, and take its result."""
    while engine.fetch_pending:
        engine.take_fetched()
        time.sleep(0.05)


def inflight(engine: Any, args: argparse.Namespace, path: str, tmp: Path) -> dict[str, Any]:
    import zmq

    from grpo_stream.models.loading import load_policy
    from grpo_stream.transport.weights import WeightServer

    weights = list(load_policy(path, dtype="float32", trainable=False).named_parameters())
    credits = args.prompts_per_request or INFLIGHT_CREDITS
    count = args.steps * args.groups_per_step + 4 * credits  # in flight at end
    rows: dict[str, dict[str, float]] = {}
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        for mode in MODES:
            settle(engine)  # a version the last mode's generator was still applying
            server = WeightServer(ctx, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0",
                                  TransportSettings(), SecuritySettings())  # fmt: skip
            trainer = StandInTrainer(server, weights, args, engine.version)
            server.publish(engine.version, weights)
            engine.enable_inflight((lambda: None) if mode == "inflight" else None)
            paused = len(engine.updater.paused_s)
            cfg = run_config(args, tmp / f"run-{mode}", mode == "inflight", credits)
            peers = m.Endpoints(weights=server.addresses["weights"],
                                announce=server.addresses["announce"])  # fmt: skip
            start = time.perf_counter()

            def during(hub: BenchHub, trainer: StandInTrainer = trainer) -> None:
                trainer.run(hub)
                hub.done.set()  # the trainer had its steps: stop the run

            hub = serve(cfg, engine, workload(count), peers, during=during)
            seconds = time.perf_counter() - start
            updates = engine.updater.paused_s[paused:]
            rows[mode] = {
                "steps_per_s": args.steps / seconds,
                "paused_per_update_s": statistics.fmean(updates or [0.0]),
                "updates": len(updates),
                "trainer_wait_per_step_s": statistics.fmean(trainer.waits),
                "token_staleness_mean": trainer.token_age / max(trainer.tokens, 1),
                "mixed_version_groups": trainer.mixed / max(trainer.groups, 1),
                "gen_tokens_per_s": hub.record.tokens() / seconds,
            }
            server.close()
    finally:
        engine.enable_inflight(None)
        ctx.destroy(linger=0)
    return {"modes": rows}
