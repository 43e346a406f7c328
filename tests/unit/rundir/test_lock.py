"""One run per run directory: a second holder is refused with the first one's pid and host;
the kernel frees the lock when its holder dies, even by SIGKILL."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_stream.rundir.lock import OWNER_ENV, RunLocked, acquire, is_held

HOLD = """
import sys, time
from pathlib import Path
from grpo_stream.rundir.lock import acquire, export_owner
lock = acquire(Path(sys.argv[1]), "up")
export_owner(lock)
print("held", flush=True)
if len(sys.argv) > 2:  # a child that runs under the lock, as up's hub does
    import subprocess
    code = "from pathlib import Path; from grpo_stream.rundir.lock import acquire; "
    code += "print('child', acquire(Path(sys.argv[1])))"
    subprocess.run([sys.executable, "-c", "import sys; " + code, sys.argv[1]], check=True)
time.sleep(60)
"""


def _holder(run_dir: Path, *extra: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir), *extra], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    proc = _holder(tmp_path / "run")
    try:
        with pytest.raises(RunLocked) as err:
            acquire(tmp_path / "run")
        assert f"pid {proc.pid} on host {socket.gethostname()}" in str(err.value)
        assert is_held(tmp_path / "run")
    finally:
        proc.kill()
        proc.wait()


def test_the_lock_is_free_after_its_holder_is_killed_with_sigkill(tmp_path):
    proc = _holder(tmp_path / "run")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    lock = acquire(tmp_path / "run")  # no cleanup needed: the stale file stays, the lock not
    assert lock is not None
    assert f"pid {os.getpid()} " in (tmp_path / "run" / ".lock").read_text()
    lock.release()
    assert not is_held(tmp_path / "run")


def test_a_process_started_by_the_holder_runs_under_its_lock(tmp_path):
    proc = _holder(tmp_path / "run", "child")
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "child None"
    finally:
        proc.kill()
        proc.wait()


def test_an_unrelated_owner_claim_does_not_pass_the_lock(tmp_path, monkeypatch):
    proc = _holder(tmp_path / "run")
    monkeypatch.setenv(OWNER_ENV, "pid 1 on host elsewhere")
    try:
        with pytest.raises(RunLocked):
            acquire(tmp_path / "run")
    finally:
        proc.kill()
        proc.wait()


def test_an_unlocked_directory_is_not_held(tmp_path):
    assert not is_held(tmp_path)
    lock = acquire(tmp_path / "new")  # creates the directory
    assert lock is not None and is_held(tmp_path / "new")
    lock.release()
