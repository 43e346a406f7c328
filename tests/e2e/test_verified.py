"""Weights and rollouts that cannot be trusted on a live `up` run with relays on (fanout 1, so
fetchers are redirected to relays): a stranger cannot become a relay; a relay holding the
run's secret that serves other weights is refused by every fetcher sent to it; a generator
that samples from another model than it claims is quarantined; the honest generators are
never flagged, and the run completes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.hub.auth import load_secret
from grpo_stream.protocols import messages as m
from grpo_stream.transport.delta import RAW, checksum, version_checksum
from grpo_stream.transport.fetch_auth import sign_fetch
from grpo_stream.transport.sockets import Client, Server, Subscriber, close_context, make_context

from .conftest import Run, assert_accounting, hub_events

pytestmark = pytest.mark.slow
STEPS = 150  # long enough for the late-joining noisy generator to fill its window
SETTINGS = ["--set", "weights.relay=true", "--set", "weights.fanout=1",
            "--set", "generator.count=2", "--set", "security.verify.window=4",
            "--set", "security.verify.max_gap=0.15",
            # every group trained, so judged: the noisy generator's groups mostly score 0 and
            # would be filtered as zero-signal before any evidence (harmless, never trained)
            "--set", "algo.advantage.filter_zero_signal=false",
            # small leases: it joins after the others, and a lease a step long (hf's credits
            # since #46) leaves it too few groups for a window
            "--set", "generator.prompts_per_request=4"]  # fmt: skip
NOISE = 0.2  # the noisy generator's weights: x (1 + 0.2 N(0, 1)) after every update
LOCAL = "tcp://127.0.0.1:0"


def _events(run_dir: Path, pattern: str, event: str) -> list[dict[str, Any]]:
    rows = []
    for path in (run_dir / "logs").glob(pattern):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("event") == event:
                rows.append(row)
    return rows


def _trainer_addresses(run_dir: Path) -> tuple[str, str]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready = _events(run_dir, "trainer-*.jsonl", "trainer.ready")
        if ready:
            return str(ready[-1]["weights"]), str(ready[-1]["announce"])
        time.sleep(0.2)
    raise AssertionError("no trainer.ready")


def _hub_address(run: Run) -> str:
    path = run.run_dir / "hub.addr"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        assert run.proc.poll() is None, run.output()[-2000:]
        time.sleep(0.1)
    raise AssertionError("the hub did not start")


def _forged(chunks: list[m.WeightsChunk]) -> list[m.WeightsChunk]:
    """The same tensors plus 1, with per-tensor and version checksums that add up."""
    tensors = [[np.asarray(t) + np.ones(1, np.asarray(t).dtype) for t in c.tensors]
               for c in chunks]  # fmt: skip
    sums = [[checksum(t) for t in ts] for ts in tensors]
    total = version_checksum([s for ss in sums for s in ss])
    return [
        m.WeightsChunk(
            version=c.version,
            index=c.index,
            count=c.count,
            names=list(c.names),
            tensors=ts,
            base=-1,
            encodings=[RAW] * len(ts),
            checksums=ss,
            checksum=total,
        )
        for c, ts, ss in zip(chunks, tensors, sums, strict=True)
    ]


class RelayOffer(threading.Thread):
    """After every announcement, asks the weight server for the version as a relay: signed
    with the run's secret (a compromised generator), or unsigned (a stranger). Its ROUTER
    serves any fetcher sent to it that version, forged, and counts them."""

    def __init__(self, weights: str, announce: str, secret: bytes | None) -> None:
        super().__init__(daemon=True)
        self.ctx = make_context()
        self.server = Server(self.ctx, LOCAL, TransportSettings(), SecuritySettings(), "relay")
        self.weights, self.announce, self.secret = weights, announce, secret
        self.asked = 0  # WeightsRequests fetchers sent it
        self.stop = threading.Event()
        self.forged: list[m.WeightsChunk] = []

    def run(self) -> None:
        sub = Subscriber(self.ctx, self.announce, TransportSettings(), SecuritySettings(), "s")
        try:
            while not self.stop.is_set():
                if isinstance(sub.recv(50), m.WeightsAnnounce):
                    self._offer()
                got = self.server.recv(0)
                if got is not None and isinstance(got[1], m.WeightsRequest):
                    self.asked += 1
                    for chunk in self.forged:
                        self.server.send(got[0], chunk)
        finally:
            sub.close()
            self.server.close()
            close_context(self.ctx)

    def _offer(self) -> None:
        address = self.server.address
        request = m.WeightsRequest(version=-1, have=-1, relay=address)
        signed = request if self.secret is None else sign_fetch(self.secret, request)
        identity = f"offer-{id(self)}-{time.monotonic_ns()}"
        client = Client(self.ctx, self.weights, TransportSettings(), SecuritySettings(), identity)
        client.send(signed)
        chunks: list[m.WeightsChunk] = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            msg = client.recv(100)
            if isinstance(msg, m.WeightsChunk):
                chunks.append(msg)
                if len(chunks) == msg.count:
                    self.forged = _forged(sorted(chunks, key=lambda c: c.index))
                    break
            elif msg is not None:  # redirected (to a relay already in the tree): fine
                break
        client.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Run, list[RelayOffer]]]:
    run = Run(tmp_path_factory.mktemp("verified") / "run", STEPS, *SETTINGS)
    noisy: subprocess.Popen[bytes] | None = None
    offers: list[RelayOffer] = []
    try:
        hub = _hub_address(run)  # the noisy generator joins as early as the others
        noisy = subprocess.Popen(
            [sys.executable, "-m", "grpo_stream.cli.main", "run", "generator", "--hub", hub,
             "--instance", "noisy-gen", "--secret-file", str(run.run_dir / "secret"),
             "--fault-weights-noise", str(NOISE), "--log-json"],
            stdout=subprocess.DEVNULL, stderr=(run.run_dir.parent / "noisy.log").open("wb"),
        )  # fmt: skip
        run.wait_steps(1)
        weights, announce = _trainer_addresses(run.run_dir)
        secret = load_secret(run.run_dir / "secret")
        offers = [RelayOffer(weights, announce, secret), RelayOffer(weights, announce, None)]
        for offer in offers:
            offer.start()
        yield run, offers
    finally:
        run.kill()
        for offer in offers:
            offer.stop.set()
        if noisy is not None:
            noisy.kill()
            noisy.wait()


def test_the_run_completes(live: tuple[Run, list[RelayOffer]]) -> None:
    run, offers = live
    assert run.finish() == 0, Path(run.log.name).read_text()[-3000:]
    for offer in offers:
        offer.stop.set()
    assert_accounting(run.run_dir, STEPS)


def test_only_the_relay_with_the_secret_was_made_one(live: tuple[Run, list[RelayOffer]]) -> None:
    run, (signed, stranger) = live
    # the stranger's unsigned offer is refused before it is read as an offer (#49: weights and
    # relaying only for members): the one request of the run without the secret's proof
    refused = _events(run.run_dir, "trainer-*.jsonl", "weights.refused_fetch")
    assert refused and refused[0]["level"] == "error"
    assert {e["reason"] for e in refused} == {
        "weights request carries no proof of the run's secret"
    }
    assert stranger.asked == 0  # no fetcher was ever sent to the stranger
    assert signed.asked > 0  # fetchers were sent to the relay with the secret ...


def test_every_fetcher_sent_to_the_forged_relay_refused_it(
    live: tuple[Run, list[RelayOffer]],
) -> None:
    run, _ = live
    refused = [e for e in _events(run.run_dir, "generator-*.jsonl", "weights.refused")
               if "the trainer announced" in e["reason"]]  # fmt: skip
    assert len(refused) >= 1 and all(e["level"] == "error" for e in refused)
    applied = _events(run.run_dir, "generator-*.jsonl", "weights.applied")
    assert applied  # ... and each then took the version from the trainer


def test_the_noisy_generator_is_quarantined_and_no_honest_one_flagged(
    live: tuple[Run, list[RelayOffer]],
) -> None:
    run, _ = live
    quarantined = hub_events(run.run_dir, "generator.quarantined")
    assert [e["instance"] for e in quarantined] == ["noisy-gen"], quarantined
    assert quarantined[0]["level"] == "error"
    (stopped,) = hub_events(run.run_dir, "hub.stopped")
    worst = stopped["verify_worst"]
    max_gap = quarantined[0]["max_gap"]
    assert worst["generator-0"] < max_gap and worst["generator-1"] < max_gap, worst
    assert worst["noisy-gen"] > max_gap
