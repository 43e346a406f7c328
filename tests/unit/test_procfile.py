"""The top-level Procfile: honcho accepts it, every line parses against the real CLI, and a
variant of it (tmp run directory, free port, two steps) trains to the end under
`honcho start`."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_stream.cli.run import OPTIONAL_SERVICES, SERVICES
from grpo_stream.training.metrics import read_metrics

from .deploy.conftest import Cli

PROCFILE = Path(__file__).parents[2] / "Procfile"
HONCHO = shutil.which("honcho") or str(Path(sys.executable).parent / "honcho")


def _lines(text: str) -> dict[str, list[str]]:
    out = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, command = line.split(":", 1)
            out[name.strip()] = shlex.split(command)
    return out


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


def test_clients_dial_the_address_the_hub_binds() -> None:
    cli = Cli()
    commands = [cli.parse_run(argv) for argv in _lines(PROCFILE.read_text()).values()]
    hub = next(c for c in commands if c.service == "grouper")
    bind = cli.hub_config(hub).hub.bind
    assert {c.params["hub"] for c in commands if c.service != "grouper"} == {bind}


@pytest.mark.slow  # about 30 s: four services load the model
def test_honcho_start_trains_a_short_run_to_the_end(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    port = _free_port()
    fast = " ".join(
        f"--set {s}"
        for s in (
            "run.max_steps=2",
            "hub.groups_per_step=2",
            "generator.group_size=4",
            "generator.prompts_per_request=2",
        )
    )
    text = PROCFILE.read_text().replace("5555", str(port))
    text = text.replace(json.dumps("runs/procfile"), json.dumps(str(run_dir)))
    text = text.replace("--instance grouper-0", f"--instance grouper-0 {fast}")
    procfile = tmp_path / "Procfile"
    procfile.write_text(text)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    # honcho stops every process once one exits: the trainer, after its last step
    subprocess.run(
        [HONCHO, "-f", str(procfile), "-d", str(tmp_path), "start"],
        capture_output=True,
        text=True,
        timeout=150,
        env=env,
    )
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2]
    assert (run_dir / "checkpoints" / "step-2" / "COMPLETE").exists()
