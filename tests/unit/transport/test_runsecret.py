"""The run's secret from a file or the environment, and the keys derived from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_stream.transport.runsecret import (
    SECRET_ENV,
    AuthError,
    derive,
    resolve_secret,
    write_secret,
)


def test_the_file_wins_over_the_environment(tmp_path: Path) -> None:
    path = write_secret(tmp_path / "secret")
    got = resolve_secret(path, {SECRET_ENV: "e" * 64})
    assert got == path.read_bytes().strip()


def test_the_environment_is_used_without_a_file() -> None:
    assert resolve_secret(None, {SECRET_ENV: " " + "e" * 64 + "\n"}) == b"e" * 64
    assert resolve_secret(None, {}) is None


def test_a_short_secret_in_the_environment_is_one_line_naming_it() -> None:
    with pytest.raises(AuthError, match=f"^{SECRET_ENV}: 5 bytes"):
        resolve_secret(None, {SECRET_ENV: "short"})


def test_each_purpose_has_its_own_key() -> None:
    secret = b"s" * 64
    assert derive(secret, "status") != derive(secret, "weights") != derive(secret, "session")
