"""Per-stage profile of one full-set weights transfer in one process (part of bench.weights,
`--phases profile`).

A real `WeightServer` (its serving thread) streams a Qwen2-0.5B-shaped bf16 set over loopback
TCP to a real `Replica.fetch` in the same process; each stage is timed on its own:
snapshot (copy + checksum; first into new memory, then into the reused buffer), encoding the
chunks' frames, the whole fetch (ZeroMQ send and receive, checksums, staging, swap), the
receiver's time inside chunk handling (reconstruct + checksum) and the rest (waiting on
the socket), and the apply (copy into preallocated arrays, as bench.weights' receivers do).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

GIB = float(1 << 30)


def profile(args: argparse.Namespace) -> dict[str, float]:
    import numpy as np
    import torch
    import zmq

    from bench.weights import transport_settings
    from bench.weights_set import shapes_of
    from grpo_stream.config.transport import SecuritySettings, WeightsSettings
    from grpo_stream.protocols.codec import encode
    from grpo_stream.transport import fetch as fetch_mod
    from grpo_stream.transport.weights import WeightServer, build_snapshot
    from grpo_stream.transport.weights_snapshot import SnapshotBuffers

    torch.set_num_threads(1)
    named = [(n, torch.full(s, 0.5, dtype=torch.bfloat16)) for n, s in shapes_of(args)]
    settings = transport_settings(args)
    nbytes = sum(t.numel() * 2 for _, t in named)
    out: dict[str, float] = {"gib": nbytes / GIB}
    pool = SnapshotBuffers()
    snaps = []  # the server holds the version served while it builds the next
    for key in ("snapshot_new_s", "snapshot_new2_s", "snapshot_reused_s"):
        t0 = time.perf_counter()
        snaps.append(build_snapshot(0, named, settings, pool))
        out[key] = time.perf_counter() - t0
        snaps = snaps[-1:]
    snap = snaps.pop()
    t0 = time.perf_counter()
    for chunk in snap.chunks:
        encode(chunk)
    out["encode_s"] = time.perf_counter() - t0
    del snap
    in_add = [0.0]
    add = fetch_mod._Staging.add

    def timed_add(self: Any, *a: Any) -> None:
        t = time.perf_counter()
        add(self, *a)
        in_add[0] += time.perf_counter() - t

    fetch_mod._Staging.add = timed_add  # type: ignore[method-assign]
    ctx: zmq.Context[Any] = zmq.Context()
    server = WeightServer(
        ctx, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", settings, SecuritySettings(),
        WeightsSettings(deltas=False),
    )  # fmt: skip
    target = {n: np.zeros(t.shape, dtype=np.uint16) for n, t in named}
    replica = fetch_mod.Replica()
    try:
        for version in range(args.rounds + 1):
            server.publish(version, named)
            in_add[0] = 0.0
            t0 = time.perf_counter()
            replica.fetch(ctx, server.addresses["weights"], settings, SecuritySettings(), version)
            t1 = time.perf_counter()
            for name, arr in replica.named():
                np.copyto(target[name], arr.view(np.uint16))
            t2 = time.perf_counter()
            if version:  # version 0 warms the sockets and the receiver's memory
                out[f"fetch_s_{version}"] = t1 - t0
                out[f"in_chunks_s_{version}"] = in_add[0]
                out[f"apply_s_{version}"] = t2 - t1
    finally:
        fetch_mod._Staging.add = add  # type: ignore[method-assign]
        server.close()
        ctx.term()
    return out


def report(out: dict[str, float]) -> None:
    gib = out["gib"]
    print(f"profile: {gib:.3f} GiB bf16 set, one process, loopback")
    for key, value in out.items():
        if key != "gib":
            print(f"  {key:>20}: {value:.3f} s ({gib / max(value, 1e-9):.2f} GiB/s)")
