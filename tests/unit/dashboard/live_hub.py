"""A real hub (`Grouper`, its ROUTER and its StatusRequest answer) served on a thread, with
peers registered as if they had said Hello: what the dashboard reads from a live run."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from pathlib import Path

from grpo_stream.config import RunConfig, load_config
from grpo_stream.hub.registry import Peer
from grpo_stream.protocols import messages as m
from grpo_stream.services.grouper import Grouper
from grpo_stream.transport.sockets import close_context


class LiveHub:
    """`do` runs a change on the hub's own thread, between two drains."""

    def __init__(self, run_dir: Path, overrides: list[str] | None = None) -> None:
        self.cfg: RunConfig = load_config(None, [f'run.run_dir="{run_dir}"', *(overrides or [])])
        self.grouper = Grouper(self.cfg)
        self.address = self.grouper.server.address
        (run_dir / "hub.addr").write_text(self.address + "\n")
        self._jobs: queue.Queue[Callable[[Grouper], None]] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            while not self._jobs.empty():
                self._jobs.get()(self.grouper)
            self.grouper._drain()

    def do(self, job: Callable[[Grouper], None]) -> None:
        done = threading.Event()

        def run(grouper: Grouper) -> None:
            job(grouper)
            done.set()

        self._jobs.put(run)
        if not done.wait(10):
            raise TimeoutError("the hub thread did not run the job")

    def join(self, service: str, instance: str, **stats: float) -> None:
        """Register `instance` as a peer of `service` (a generator with its counters)."""

        def register(grouper: Grouper) -> None:
            peer = Peer(service, instance, instance.encode(), "host-a", 1, 0, {}, credits=3)
            if service == "generator":
                peer.generator = m.GeneratorStats(
                    tokens_per_s=stats.get("tokens_per_s", 100.0), wait_s=0.0,
                    version=int(stats.get("version", 0)), batches=1, prompts_total=1, busy_s=1.0,
                )  # fmt: skip
            else:
                peer.stats.update(stats)
            grouper.registry.register(peer, 0.0)

        self.do(register)

    def leave(self, instance: str) -> None:
        def remove(grouper: Grouper) -> None:
            grouper.registry.remove(instance)

        self.do(remove)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.grouper.server.close()
        close_context(self.grouper.ctx)
