"""deploy/systemd started as written (no systemd here: each unit's ExecStart is expanded as
systemd expands it, tests/unit/deploy/test_systemd.py, and run as a process with the unit's
Environment=): hub, trainer, a generator and a scorer train a short run on this machine, the
secret handed over as a systemd credential (%d), while a stranger without it tries to
register as a scorer at the hub's port (bound on all interfaces, as the unit does)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_stream.protocols import messages as m

from ...unit.deploy.test_systemd import UNITS, exec_argv, read_env_file, read_unit
from ..conftest import metrics
from .conftest import events, stranger_hello

DEPLOY = Path(__file__).parents[3] / "deploy" / "systemd"
STEPS = 20
CONFIG = """[run]
max_steps = 20
[hub]
groups_per_step = 2
[generator]
group_size = 4
prompts_per_request = 2
"""

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


def _unit_env(unit_path: Path, base: dict[str, str]) -> dict[str, str]:
    """The unit's Environment= lines on top of `base` (%i: instance 0)."""
    env = dict(base)
    for line in read_unit(unit_path)["Service"]["Environment"].split("\n"):
        key, _, value = line.strip().partition("=")
        if key:
            env[key] = value.replace("%i", "0")
    return env


def test_units_train_with_the_credential_secret_and_refuse_a_stranger(tmp_path: Path) -> None:
    credentials = tmp_path / "credentials"
    subprocess.run([sys.executable, "-m", "grpo_stream.cli.main", "keys", "secret",
                    str(credentials / "secret")], check=True, capture_output=True)  # fmt: skip
    (tmp_path / "run.toml").write_text(CONFIG)
    hub_port, trainer_port = _free_port(), _free_port()
    env = read_env_file(DEPLOY / "env.example") | {
        "GRPO_HUB": f"tcp://127.0.0.1:{hub_port}",
        "GRPO_HUB_PORT": str(hub_port),
        "GRPO_CONFIG": str(tmp_path / "run.toml"),
        "GRPO_RUN_DIR": str(tmp_path / "run"),
        "GRPO_TRAINER_HOST": "127.0.0.1",
        "GRPO_TRAINER_PORT": str(trainer_port),
    }
    base = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "HOME": str(tmp_path)}  # fmt: skip
    exe = str(Path(sys.executable).parent / "grpo-stream")
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for service, name in UNITS.items():
            argv = exec_argv(read_unit(DEPLOY / name), env, credentials=str(credentials))
            assert argv[0] == "/opt/grpo-stream/venv/bin/grpo-stream"
            with (tmp_path / f"{service}.log").open("wb") as log:
                procs[service] = subprocess.Popen(
                    [exe, *argv[1:]], stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
                    env=_unit_env(DEPLOY / name, base), start_new_session=True,
                )  # fmt: skip
        deadline = time.monotonic() + 120
        while not (tmp_path / "run" / "hub.addr").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        reply = stranger_hello(f"tcp://127.0.0.1:{hub_port}")
        rc = procs["trainer"].wait(timeout=300)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    logs = {s: (tmp_path / f"{s}.log").read_text()[-1500:] for s in UNITS}
    assert rc == 0, logs
    assert isinstance(reply, m.Error) and reply.code == "bad_hello", reply
    run_dir = tmp_path / "run"
    assert [r["step"] for r in metrics(run_dir)] == list(range(1, STEPS + 1)), logs
    hosts = {e["host"] for e in events(run_dir, "grouper", "peer.joined")}
    assert "stranger" not in hosts
