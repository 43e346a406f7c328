"""Under CURVE the hub checks the role a Hello claims against the key it authenticated with:
a real hub socket with its ZAP authenticator, real clients with `keys init` key pairs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo_stream.config import load_config
from grpo_stream.config.transport import SecuritySettings
from grpo_stream.protocols import messages as m
from grpo_stream.services.grouper import Grouper
from grpo_stream.transport.curve import init_keys
from grpo_stream.transport.sockets import Client, close_context


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Grouper]:
    init_keys(tmp_path / "keys")
    cfg = load_config(
        None,
        [f'run.run_dir="{tmp_path / "run"}"', "security.curve=true",
         f'security.keys_dir="{tmp_path / "keys"}"'],
    )  # fmt: skip
    grouper = Grouper(cfg)
    yield grouper
    grouper.server.close()
    close_context(grouper.ctx)


def _hello_with_key(hub: Grouper, key: str, service: str) -> m.Message | None:
    """Say Hello as `service` with the key pair `key`; the hub's reply."""
    security = SecuritySettings(curve=True, keys_dir=hub.cfg.security.keys_dir, client_name=key)
    client = Client(hub.ctx, hub.server.address, hub.cfg.transport, security, f"{service}-0")
    try:
        client.send(m.Hello(service=service, instance=f"{service}-0", host="h", pid=1,
                            capacity=1))  # fmt: skip
        got = hub.server.recv(10_000)
        assert got is not None, "the hub received nothing"
        hub._handle(*got)
        return client.recv(5000)
    finally:
        client.close()


def test_a_generator_key_cannot_say_hello_as_the_trainer(hub: Grouper) -> None:
    reply = _hello_with_key(hub, "generator", "trainer")
    assert isinstance(reply, m.Error) and "generator key cannot" in reply.message
    assert hub.registry.peers == {}


def test_a_role_less_key_cannot_say_hello(hub: Grouper) -> None:
    reply = _hello_with_key(hub, "client", "scorer")
    assert isinstance(reply, m.Error) and "no role" in reply.message
    assert hub.registry.peers == {}


def test_a_key_says_hello_in_its_own_role(hub: Grouper) -> None:
    assert isinstance(_hello_with_key(hub, "trainer", "trainer"), m.Welcome)
    assert list(hub.registry.peers) == ["trainer-0"]
