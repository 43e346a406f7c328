"""A peer process for transport tests: `python _peer.py MODE ADDRESS SETTINGS_JSON [OUT]`.

hello: handshake with a hub at ADDRESS and print the Welcome as JSON.
fetch: fetch the newest weights from ADDRESS, save them to OUT (.npz) and print
       {"version", "names"} as JSON.
serve: bind a weight server (ADDRESS: where), publish version 1 of OUT MiB (1 MiB tensors),
       print its {"weights", "announce"} addresses as JSON and serve until killed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import numpy as np

from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.logs import setup_logging
from grpo_stream.protocols.messages import Hello
from grpo_stream.transport.fetch import fetch_weights
from grpo_stream.transport.sockets import Client, close_context, handshake, make_context


def main(argv: list[str]) -> int:
    mode, address, raw = argv[:3]
    setup_logging("peer", str(os.getpid()))  # logs to stderr; stdout carries the result
    settings = TransportSettings.model_validate_json(raw)
    security = SecuritySettings()
    ctx = make_context()
    try:
        if mode == "hello":
            client = Client(ctx, address, settings, security, f"peer-{os.getpid()}")
            hello = Hello(service="generator", instance="peer", host="localhost",
                          pid=os.getpid(), capacity=4)  # fmt: skip
            welcome = handshake(client, hello, timeout_s=20.0)
            client.close()
            peers = None if welcome.peers is None else dataclasses.asdict(welcome.peers)
            print(json.dumps({"run_id": welcome.run_id, "peers": peers}))
        elif mode == "fetch":
            version, tensors = fetch_weights(ctx, address, settings, security, timeout_s=30.0)
            np.savez(argv[3], **dict(tensors))  # type: ignore[arg-type]
            print(json.dumps({"version": version, "names": [n for n, _ in tensors]}))
        elif mode == "serve":
            import torch

            from grpo_stream.transport.weights import WeightServer

            server = WeightServer(ctx, address, address, settings, security)
            server.publish(1, [(f"t{i}", torch.full((1 << 18,), 1.0)) for i in range(int(argv[3]))])
            print(json.dumps(server.addresses), flush=True)
            while True:
                time.sleep(1)
        else:
            print(f"unknown mode {mode}", file=sys.stderr)
            return 2
    finally:
        close_context(ctx)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
