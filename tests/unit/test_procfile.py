"""The top-level Procfile: honcho accepts it, every line makes the run's secret and runs a
service with it (both commands parsed by the real CLI), and a variant of it (tmp run
directory, free port, a few steps) trains to the end under `honcho start` while a stranger
without the secret tries to register."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_stream.cli.run import OPTIONAL_SERVICES, SERVICES
from grpo_stream.training.metrics import read_metrics

from .deploy.conftest import Cli

PROCFILE = Path(__file__).parents[2] / "Procfile"
HONCHO = shutil.which("honcho") or str(Path(sys.executable).parent / "honcho")


SECRET = "runs/procfile/secret"


def _commands(text: str) -> dict[str, list[list[str]]]:
    """Each line's commands: `A && exec B` gives [A, B]."""
    out = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, command = line.split(":", 1)
            parts = [shlex.split(part) for part in command.split("&&")]
            out[name.strip()] = [p[1:] if p[0] == "exec" else p for p in parts]
    return out


def _lines(text: str) -> dict[str, list[str]]:
    """The service each line runs (its last command)."""
    return {name: commands[-1] for name, commands in _commands(text).items()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_honcho_check_accepts_the_procfile() -> None:
    result = subprocess.run(
        [HONCHO, "-f", str(PROCFILE), "check"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_every_line_runs_a_service_with_real_cli_options() -> None:
    cli = Cli()
    commands = {name: cli.parse_run(argv) for name, argv in _lines(PROCFILE.read_text()).items()}
    required = sorted(set(SERVICES) - set(OPTIONAL_SERVICES))
    assert sorted(c.service for c in commands.values()) == required


def test_every_line_makes_the_secret_and_gives_it_to_its_service() -> None:
    cli = Cli()
    for name, (first, service) in _commands(PROCFILE.read_text()).items():
        made = cli.parse(first)
        assert made.path == ("keys", "secret") and str(made.params["path"]) == SECRET, name
        assert str(cli.parse_run(service).params["secret_file"]) == SECRET, name


def test_clients_dial_the_address_the_hub_binds() -> None:
    cli = Cli()
    commands = [cli.parse_run(argv) for argv in _lines(PROCFILE.read_text()).values()]
    hub = next(c for c in commands if c.service == "grouper")
    bind = cli.hub_config(hub).hub.bind
    assert {c.params["hub"] for c in commands if c.service != "grouper"} == {bind}


@pytest.mark.slow  # about 40 s: four services load the model
def test_honcho_start_trains_to_the_end_and_a_stranger_is_refused(tmp_path: Path) -> None:
    from grpo_stream.protocols import messages as m

    from ..e2e.clusters.conftest import events, stranger_hello

    run_dir = tmp_path / "run"
    port = _free_port()
    fast = " ".join(
        f"--set {s}"
        for s in (
            "run.max_steps=20",
            "hub.groups_per_step=2",
            "generator.group_size=4",
            "generator.prompts_per_request=2",
        )
    )
    text = PROCFILE.read_text().replace("5555", str(port))
    text = text.replace("runs/procfile", str(run_dir))
    text = text.replace("--instance grouper-0", f"--instance grouper-0 {fast}")
    procfile = tmp_path / "Procfile"
    procfile.write_text(text)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    # honcho stops every process once one exits: the trainer, after its last step
    honcho = subprocess.Popen(
        [HONCHO, "-f", str(procfile), "-d", str(tmp_path), "start"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "hub.addr").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        reply = stranger_hello(f"tcp://127.0.0.1:{port}")
        honcho.wait(timeout=180)
    finally:
        if honcho.poll() is None:
            os.killpg(honcho.pid, signal.SIGTERM)
            honcho.wait(timeout=60)
    assert isinstance(reply, m.Error) and reply.code == "bad_hello", reply
    assert stat.S_IMODE((run_dir / "secret").stat().st_mode) == 0o600
    assert [r["step"] for r in read_metrics(run_dir)] == list(range(1, 21))
    assert (run_dir / "checkpoints" / "step-20" / "COMPLETE").exists()
    assert "stranger" not in {e["host"] for e in events(run_dir, "grouper", "peer.joined")}
