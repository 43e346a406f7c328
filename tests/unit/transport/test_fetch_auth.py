"""Who may fetch weights: a request signed with the run's secret, fresh and never seen; under
CURVE with per-role keys, only from a generator's key."""

from __future__ import annotations

import copy
from pathlib import Path

import zmq.auth

from grpo_stream.config.transport import SecuritySettings
from grpo_stream.protocols.messages import WeightsRequest
from grpo_stream.transport.curve import init_keys
from grpo_stream.transport.fetch_auth import FetchGuard, sign_fetch
from grpo_stream.transport.runsecret import MAX_AGE_S

SECRET = b"w" * 64
PLAIN = SecuritySettings()


def request() -> WeightsRequest:
    return WeightsRequest(version=-1, have=3, relay="tcp://10.0.0.2:5601")


def test_a_request_signed_with_the_secret_is_served() -> None:
    assert FetchGuard(SECRET, PLAIN).check(sign_fetch(SECRET, request()), None) is None


def test_an_unsigned_request_is_refused() -> None:
    assert "no proof" in (FetchGuard(SECRET, PLAIN).check(request(), None) or "")


def test_a_request_signed_with_another_secret_is_refused() -> None:
    signed = sign_fetch(b"x" * 64, request())
    assert "does not match" in (FetchGuard(SECRET, PLAIN).check(signed, None) or "")


def test_a_signed_request_altered_to_offer_another_relay_is_refused() -> None:
    moved = sign_fetch(SECRET, request())
    moved.relay = "tcp://10.6.6.6:5601"  # the signature covers the relay's address
    assert "does not match" in (FetchGuard(SECRET, PLAIN).check(moved, None) or "")


def test_a_replayed_request_is_refused() -> None:
    guard = FetchGuard(SECRET, PLAIN)
    captured = sign_fetch(SECRET, request())
    assert guard.check(captured, None) is None
    assert "replayed" in (guard.check(copy.copy(captured), None) or "")


def test_a_request_signed_long_ago_is_refused() -> None:
    old = sign_fetch(SECRET, request(), now=1000.0)
    late = FetchGuard(SECRET, PLAIN).check(old, None, now=1001.0 + MAX_AGE_S)
    assert "receiver's clock" in (late or "")


def test_without_a_secret_or_roles_nothing_is_checked() -> None:
    guard = FetchGuard(None, PLAIN)
    assert not guard.guarded and guard.check(request(), None) is None


def _key(keys: Path, name: str) -> str:
    public, _ = zmq.auth.load_certificate(str(keys / f"{name}.key"))
    return public.decode()


def test_under_per_role_keys_only_a_generator_or_the_evaluator_key_fetches(
    tmp_path: Path,
) -> None:
    init_keys(tmp_path / "keys")
    guard = FetchGuard(None, SecuritySettings(curve=True, keys_dir=tmp_path / "keys"))
    plain = WeightsRequest(version=-1, have=3)  # a fetch that relays to no one
    for fetcher in ("generator", "evaluator"):
        assert guard.check(plain, _key(tmp_path / "keys", fetcher)) is None
    for other in ("scorer", "trainer", "teacher", "client"):
        why = guard.check(plain, _key(tmp_path / "keys", other)) or ""
        assert "not a generator's or the evaluator's" in why


def test_under_per_role_keys_only_a_generator_key_becomes_a_relay(tmp_path: Path) -> None:
    init_keys(tmp_path / "keys")
    guard = FetchGuard(None, SecuritySettings(curve=True, keys_dir=tmp_path / "keys"))
    relaying = request()  # names a relay
    assert guard.check(relaying, _key(tmp_path / "keys", "generator")) is None
    why = guard.check(relaying, _key(tmp_path / "keys", "evaluator")) or ""
    assert "only a generator may relay weights" in why
