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


def test_a_hello_signed_with_the_secret_for_the_hubs_challenge_is_accepted() -> None:
    auth = HelloAuth(SECRET)
    signed = sign(hello(), SECRET, auth.challenge)
    assert not auth.stale(signed.auth)
    assert auth.check(signed) is None


def test_an_unsigned_hello_is_refused() -> None:
    auth = HelloAuth(SECRET)
    assert not auth.stale(hello().auth)  # refused, not challenged: it has no signature
    assert "no valid auth" in (auth.check(hello()) or "")


def test_a_hello_signed_with_another_secret_is_refused() -> None:
    auth = HelloAuth(SECRET)
    signed = sign(hello(), b"x" * 32, auth.challenge)
    assert "does not match" in (auth.check(signed) or "")


def test_a_signed_hello_altered_to_claim_another_role_or_endpoints_is_refused() -> None:
    auth = HelloAuth(SECRET)
    role = sign(hello("generator"), SECRET, auth.challenge)
    role.service = "trainer"
    assert auth.check(role) is not None
    moved = sign(hello(endpoints=ends("tcp://h:1")), SECRET, auth.challenge)
    moved.endpoints = ends("tcp://127.0.0.1:9")
    assert auth.check(moved) is not None


def test_a_replayed_hello_is_refused() -> None:
    auth = HelloAuth(SECRET)
    captured = sign(hello(), SECRET, auth.challenge)
    assert auth.check(captured) is None
    assert "replayed" in (auth.check(captured) or "")


def test_a_hello_signed_for_a_hub_before_its_restart_is_challenged_not_accepted() -> None:
    before, after = HelloAuth(SECRET), HelloAuth(SECRET)  # the same run's hub, restarted
    captured = sign(hello(), SECRET, before.challenge)
    assert before.challenge != after.challenge
    assert after.stale(captured.auth)
    assert "another hub's challenge" in (after.check(captured) or "")


def test_a_hello_older_than_the_max_age_is_refused() -> None:
    auth = HelloAuth(SECRET)
    old = sign(hello(), SECRET, auth.challenge, now=1000.0)
    assert "from the receiver's clock" in (auth.check(old, now=1001.0 + MAX_AGE_S) or "")


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


def _challenge_of(grouper: Grouper) -> str:
    auth = grouper.sessions.auth
    assert auth is not None
    return auth.challenge


def test_a_hello_signed_with_the_runs_secret_joins(hub) -> None:  # type: ignore[no-untyped-def]
    grouper, secret = hub
    signed = sign(hello(endpoints=ends("tcp://h:2")), secret, _challenge_of(grouper))
    grouper._handle(b"trainer-0", signed)
    assert list(grouper.registry.peers) == ["trainer-0"]
    assert grouper.sessions.trainer_endpoints == ends("tcp://h:2")


def test_a_hello_for_another_challenge_gets_the_challenge_and_changes_nothing(hub) -> None:  # type: ignore[no-untyped-def]
    grouper, secret = hub
    sent: list[tuple[bytes, m.Message]] = []
    grouper.server.send = lambda identity, msg: sent.append((identity, msg)) or True  # type: ignore[method-assign]
    grouper._handle(b"trainer-0", sign(hello(endpoints=ends("tcp://h:2")), secret, "0" * 32))
    assert grouper.registry.peers == {} and grouper.sessions.trainer_endpoints is None
    ((to, reply),) = sent
    assert to == b"trainer-0" and isinstance(reply, m.Challenge)
    assert reply.challenge == _challenge_of(grouper) and reply.in_reply_to == "hello"
