"""The code stays ruff- and mypy-clean: typed throughout, `mypy --strict` over the package as
it installs (pyproject.toml's [tool.mypy], scripts/typecheck.py; the README's Development)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ["grpo_stream", "services", "protocols", "tests", "bench"]


def _run(*cmd: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_ruff_check_is_clean() -> None:
    result = _run(sys.executable, "-m", "ruff", "check", *SOURCES)
    assert result.returncode == 0, result.stdout[-4000:]


def test_ruff_format_is_applied() -> None:
    result = _run(sys.executable, "-m", "ruff", "format", "--check", *SOURCES)
    assert result.returncode == 0, result.stdout[-4000:]


@pytest.mark.timeout(900)  # ~2 minutes alone; several times that on a loaded machine
def test_mypy_strict_is_clean() -> None:
    result = _run(sys.executable, "scripts/typecheck.py")
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
