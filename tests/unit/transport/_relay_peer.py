"""A relaying generator for the relay tests: `python _relay_peer.py ADDRESS DELAY_S`.

Fetches the newest version from ADDRESS with a relay bound; hands each chunk on to the
relay DELAY_S late (a slow link, so a test can kill it mid-stream); prints
{"relay": address} as soon as the relay is bound and {"version": v} once fetched, then
keeps serving until killed.
"""

from __future__ import annotations

import json
import os
import sys
import time

from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.logs import setup_logging
from grpo_stream.protocols.messages import WeightsChunk
from grpo_stream.transport.fetch import Replica
from grpo_stream.transport.relay import Relay
from grpo_stream.transport.sockets import make_context


class SlowRelay(Relay):
    delay_s = 0.0

    def offer(self, chunk: WeightsChunk) -> None:
        time.sleep(self.delay_s)
        super().offer(chunk)


def main(address: str, delay_s: str) -> None:
    setup_logging("relay-peer", str(os.getpid()))
    settings, security = TransportSettings(io_timeout_ms=2000), SecuritySettings()
    ctx = make_context()
    relay = SlowRelay(ctx, "tcp://127.0.0.1:0", settings, security)
    relay.delay_s = float(delay_s)
    print(json.dumps({"relay": relay.address}), flush=True)
    version = Replica().fetch(ctx, address, settings, security, timeout_s=60, relay=relay)
    print(json.dumps({"version": version}), flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main(*sys.argv[1:3])
