"""CURVE: only allow-listed client keys get through; plaintext peers are refused."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import zmq.auth

from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.protocols.messages import StatusRequest
from grpo_stream.transport.curve import ROLES, add_client, init_keys, key_roles
from grpo_stream.transport.errors import KeysError
from grpo_stream.transport.sockets import Client, Context, Server

LOCAL = "tcp://127.0.0.1:0"
REFUSED_WAIT_MS = 500


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    init_keys(tmp_path / "keys")
    return tmp_path / "keys"


def _secure(keys: Path, name: str = "client") -> SecuritySettings:
    return SecuritySettings(curve=True, keys_dir=keys, client_name=name)


def test_init_writes_pairs_and_allow_list(keys: Path) -> None:
    names = sorted(p.name for p in keys.iterdir())
    clients = ["client", *ROLES]
    pairs = [f"{n}{ext}" for n in [*clients, "server"] for ext in (".key", ".key_secret")]
    assert names == sorted(["authorized", *pairs])
    assert sorted(p.name for p in (keys / "authorized").iterdir()) == sorted(
        f"{n}.key" for n in clients
    )


def test_init_writes_one_key_per_role_and_a_role_less_client(keys: Path) -> None:
    roles = key_roles(keys)
    assert sorted(roles.values(), key=str) == sorted([None, *ROLES], key=str)
    trainer_public, _ = zmq.auth.load_certificate(str(keys / "trainer.key"))
    assert roles[trainer_public.decode()] == "trainer"


def test_secret_keys_are_private(keys: Path) -> None:
    mode = stat.S_IMODE((keys / "server.key_secret").stat().st_mode)
    assert mode == 0o600


def test_init_refuses_to_overwrite(keys: Path) -> None:
    with pytest.raises(KeysError, match="already exist"):
        init_keys(keys)


def test_allowed_client_round_trips(ctx: Context, settings: TransportSettings, keys: Path) -> None:
    server = Server(ctx, LOCAL, settings, _secure(keys), "hub")
    client = Client(ctx, server.address, settings, _secure(keys), "g0")
    client.send(StatusRequest())
    got = None
    for _ in range(100):
        got = got or server.recv(50)
    assert got == (b"g0", StatusRequest())
    client.close()
    server.close()


def test_added_client_is_allowed(ctx: Context, settings: TransportSettings, keys: Path) -> None:
    add_client(keys, "host2")
    server = Server(ctx, LOCAL, settings, _secure(keys), "hub")
    client = Client(ctx, server.address, settings, _secure(keys, "host2"), "g2")
    client.send(StatusRequest())
    assert server.recv(5000) == (b"g2", StatusRequest())
    client.close()
    server.close()


def test_client_with_unknown_key_is_refused(
    ctx: Context, settings: TransportSettings, keys: Path
) -> None:
    zmq.auth.create_certificates(str(keys), "intruder")  # a key pair nobody allowed
    server = Server(ctx, LOCAL, settings, _secure(keys), "hub")
    client = Client(ctx, server.address, settings, _secure(keys, "intruder"), "bad")
    client.send(StatusRequest())
    assert server.recv(REFUSED_WAIT_MS) is None
    client.close()
    server.close()


def test_plaintext_client_is_refused(ctx: Context, settings: TransportSettings, keys: Path) -> None:
    server = Server(ctx, LOCAL, settings, _secure(keys), "hub")
    client = Client(ctx, server.address, settings, SecuritySettings(), "plain")
    client.send(StatusRequest())
    assert server.recv(REFUSED_WAIT_MS) is None
    client.close()
    server.close()


def test_missing_keys_dir_content_raises_named_error(
    ctx: Context, settings: TransportSettings, tmp_path: Path
) -> None:
    with pytest.raises(KeysError, match="keys init"):
        Server(ctx, LOCAL, settings, _secure(tmp_path), "hub")


def test_weights_fetch_over_curve(ctx: Context, settings: TransportSettings, keys: Path) -> None:
    import torch

    from grpo_stream.transport.fetch import fetch_weights
    from grpo_stream.transport.weights import WeightServer

    server = WeightServer(ctx, LOCAL, LOCAL, settings, _secure(keys))
    server.publish(3, [("w", torch.ones(2, 2))])
    generator = _secure(keys, "generator")
    version, tensors = fetch_weights(ctx, server.addresses["weights"], settings, generator)
    assert version == 3 and [n for n, _ in tensors] == ["w"]
    server.close()


def test_a_key_of_another_role_gets_no_weights(
    ctx: Context, settings: TransportSettings, keys: Path
) -> None:
    import torch

    from grpo_stream.transport.errors import WeightsError
    from grpo_stream.transport.fetch import fetch_weights
    from grpo_stream.transport.weights import WeightServer

    server = WeightServer(ctx, LOCAL, LOCAL, settings, _secure(keys))
    server.publish(3, [("w", torch.ones(2, 2))])
    for name in ("client", "scorer"):  # the status key and a scorer's: allowed, no fetchers
        with pytest.raises(WeightsError, match="unauthorized"):
            fetch_weights(ctx, server.addresses["weights"], settings, _secure(keys, name))
    assert server.sent_bytes == 0
    server.close()


def test_weights_fetch_with_unknown_key_times_out(
    ctx: Context, settings: TransportSettings, keys: Path
) -> None:
    import torch

    from grpo_stream.transport.errors import WeightsTimeout
    from grpo_stream.transport.fetch import fetch_weights
    from grpo_stream.transport.weights import WeightServer

    zmq.auth.create_certificates(str(keys), "intruder")
    server = WeightServer(ctx, LOCAL, LOCAL, settings, _secure(keys))
    server.publish(3, [("w", torch.ones(2, 2))])
    with pytest.raises(WeightsTimeout):
        fetch_weights(ctx, server.addresses["weights"], settings, _secure(keys, "intruder"),
                      timeout_s=REFUSED_WAIT_MS / 1000)  # fmt: skip
    server.close()


HOG = "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end: pass"
"""A CPU hog that ends by itself (2 minutes at most), started once per core and then some."""


@pytest.mark.slow
def test_a_refused_key_is_a_weights_timeout_beside_cpu_hogs(
    ctx: Context, settings: TransportSettings, keys: Path
) -> None:
    """Whatever the timing of the refusal against the send (a starved I/O thread), the fetch
    raises the error it promises. About 30 s."""
    import torch

    from grpo_stream.transport.errors import WeightsTimeout
    from grpo_stream.transport.fetch import fetch_weights
    from grpo_stream.transport.weights import WeightServer

    zmq.auth.create_certificates(str(keys), "intruder")
    server = WeightServer(ctx, LOCAL, LOCAL, settings, _secure(keys))
    server.publish(3, [("w", torch.ones(2, 2))])
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        address, intruder = server.addresses["weights"], _secure(keys, "intruder")
        for _ in range(10):
            with pytest.raises(WeightsTimeout):
                fetch_weights(ctx, address, settings, intruder, timeout_s=REFUSED_WAIT_MS / 1000)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        server.close()


def test_announcements_reach_an_allowed_subscriber(
    ctx: Context, settings: TransportSettings, keys: Path
) -> None:
    import torch

    from grpo_stream.transport.fetch import WeightsWatcher
    from grpo_stream.transport.weights import WeightServer

    server = WeightServer(ctx, LOCAL, LOCAL, settings, _secure(keys))
    watcher = WeightsWatcher(ctx, server.addresses["announce"], settings, _secure(keys))
    seen, version = None, 0
    while seen is None and version < 100:  # until the subscription has propagated
        version += 1
        server.publish(version, [("w", torch.ones(1))])
        seen = watcher.poll(timeout_ms=100)
    assert seen == version
    watcher.close()
    server.close()


def test_relay_link_is_curve_secured(ctx: Context, settings: TransportSettings, keys: Path) -> None:
    import torch

    from grpo_stream.config.transport import WeightsSettings
    from grpo_stream.protocols.messages import WeightsRequest
    from grpo_stream.transport.fetch import Replica
    from grpo_stream.transport.relay import Relay
    from grpo_stream.transport.weights import WeightServer

    weights = WeightsSettings(relay=True, fanout=1)
    server = WeightServer(ctx, LOCAL, LOCAL, settings, _secure(keys), weights)
    relay = Relay(ctx, LOCAL, settings, _secure(keys, "generator"))
    server.publish(3, [("w", torch.ones(2, 2))])
    first, second = Replica(), Replica()
    generator = _secure(keys, "generator")  # only generator keys fetch, and so relay
    address = server.addresses["weights"]
    first.fetch(ctx, address, settings, generator, weights=weights, relay=relay)
    assert second.fetch(ctx, server.addresses["weights"], settings, generator) == 3
    assert server.redirects == 1  # the second came through the relay, over CURVE
    plain = Client(ctx, relay.address, settings, SecuritySettings(), "plain")
    plain.send(WeightsRequest(version=3, have=-1))
    reply = plain.recv(REFUSED_WAIT_MS)
    assert reply is None  # a plaintext peer gets nothing from the relay
    plain.close()
    relay.close()
    server.close()
