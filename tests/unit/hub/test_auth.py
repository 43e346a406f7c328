"""Hello authentication with the run's secret: who can join a hub that has one."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from grpo_stream.config import load_config
from grpo_stream.hub.auth import MAX_AGE_S, AuthError, HelloAuth, load_secret, sign, write_secret
from grpo_stream.protocols import messages as m
from grpo_stream.services.grouper import Grouper
from grpo_stream.transport.sockets import close_context

SECRET = b"s" * 32


def ends(weights: str) -> m.Endpoints:
    return m.Endpoints(weights=weights, announce="tcp://h:9")


def hello(service: str = "trainer", endpoints: m.Endpoints | None = None) -> m.Hello:
    return m.Hello(
        service=service, instance=f"{service}-0", host="h", pid=7, capacity=1, rank=0,
        endpoints=endpoints,
    )  # fmt: skip


def test_a_hello_signed_with_the_secret_is_accepted() -> None:
    assert HelloAuth(SECRET).check(sign(hello(), SECRET)) is None


def test_an_unsigned_hello_is_refused() -> None:
    assert "no valid auth" in (HelloAuth(SECRET).check(hello()) or "")


def test_a_hello_signed_with_another_secret_is_refused() -> None:
    assert "does not match" in (HelloAuth(SECRET).check(sign(hello(), b"x" * 32)) or "")


def test_a_signed_hello_altered_to_claim_another_role_or_endpoints_is_refused() -> None:
    auth = HelloAuth(SECRET)
    role = sign(hello("generator"), SECRET)
    role.service = "trainer"
    assert auth.check(role) is not None
    moved = sign(hello(endpoints=ends("tcp://h:1")), SECRET)
    moved.endpoints = ends("tcp://127.0.0.1:9")
    assert auth.check(moved) is not None


def test_a_replayed_hello_is_refused() -> None:
    auth = HelloAuth(SECRET)
    captured = sign(hello(), SECRET)
    assert auth.check(captured) is None
    assert "replayed" in (auth.check(captured) or "")


def test_a_hello_older_than_the_max_age_is_refused() -> None:
    old = sign(hello(), SECRET, now=1000.0)
    assert "from the hub's clock" in (HelloAuth(SECRET).check(old, now=1001.0 + MAX_AGE_S) or "")


def test_the_written_secret_is_private_and_long_enough(tmp_path: Path) -> None:
    path = write_secret(tmp_path / "run" / "secret")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(load_secret(path)) >= 32


def test_each_run_gets_a_new_secret(tmp_path: Path) -> None:
    first = load_secret(write_secret(tmp_path / "secret"))
    assert load_secret(write_secret(tmp_path / "secret")) != first


def test_a_secret_file_readable_by_others_is_refused_with_its_name(tmp_path: Path) -> None:
    path = write_secret(tmp_path / "secret")
    path.chmod(0o644)
    with pytest.raises(AuthError, match=r"secret_file .*secret: readable by others"):
        load_secret(path)


def test_a_short_secret_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"short")
    path.chmod(0o600)
    with pytest.raises(AuthError, match="at least 32"):
        load_secret(path)


@pytest.fixture
def hub(tmp_path: Path):  # type: ignore[no-untyped-def]
    secret = write_secret(tmp_path / "secret")
    cfg = load_config(None, [f'run.run_dir="{tmp_path}"', f'security.secret_file="{secret}"'])
    grouper = Grouper(cfg)
    yield grouper, load_secret(secret)
    grouper.server.close()
    close_context(grouper.ctx)


def test_a_stranger_hello_as_trainer_changes_nothing_at_a_hub_with_a_secret(hub) -> None:  # type: ignore[no-untyped-def]
    grouper, _ = hub
    grouper._handle(b"trainer-0", hello(endpoints=ends("tcp://127.0.0.1:1")))
    assert grouper.registry.peers == {}
    assert grouper.sessions.trainer_endpoints is None
    assert grouper.server.rejected["bad_hello"] == 1


def test_a_hello_signed_with_the_runs_secret_joins(hub) -> None:  # type: ignore[no-untyped-def]
    grouper, secret = hub
    grouper._handle(b"trainer-0", sign(hello(endpoints=ends("tcp://h:2")), secret))
    assert list(grouper.registry.peers) == ["trainer-0"]
    assert grouper.sessions.trainer_endpoints == ends("tcp://h:2")
