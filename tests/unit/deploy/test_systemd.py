"""deploy/systemd: unit templates parsed, their ExecStart expanded as systemd would, and the
resulting command lines checked against the real CLI and config.

Expansion follows systemd.service(5): specifiers (%i, %H) first, then the line is split into
words (double quotes with C escapes), then "${VAR}" is replaced inside a word and a word that
is exactly "$VAR" becomes the variable's value split at whitespace (none when empty).
"""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

UNITS = {
    "grouper": "grpo-stream-hub.service",
    "trainer": "grpo-stream-trainer.service",
    "generator": "grpo-stream-generator@.service",
    "scorer": "grpo-stream-scorer@.service",
}
ENV_FILES = ("env.example", "env.curve.example")
INSTANCE, HOST = "3", "gpu-host-7"
CREDENTIALS = "/run/credentials/unit.service"
"""What systemd's %d (the unit's credentials directory) stands for here."""


class _Repeated(dict[str, Any]):
    """configparser's dict type: a key set again (Environment=) adds lines instead of replacing."""

    def __setitem__(self, key: str, value: Any) -> None:
        if isinstance(value, list) and isinstance(self.get(key), list):
            self[key].extend(value)
        else:
            super().__setitem__(key, value)


def read_unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(
        strict=False, interpolation=None, delimiters=("=",), dict_type=_Repeated
    )
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string(path.read_text(), source=str(path))
    return parser


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as systemd's EnvironmentFile= reads them (comments, quoted values)."""
    env: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def exec_argv(
    unit: configparser.ConfigParser, env: dict[str, str], credentials: str = CREDENTIALS
) -> list[str]:
    line = unit["Service"]["ExecStart"].replace("\\\n", " ")
    line = line.replace("%i", INSTANCE).replace("%H", HOST).replace("%d", credentials)
    assert "%" not in line, f"unexpected specifier in {line!r}"
    argv: list[str] = []
    for word in shlex.split(line):
        whole = re.fullmatch(r"\$([A-Za-z_]\w*)", word)
        if whole:
            argv += env[whole[1]].split()
        else:
            argv.append(re.sub(r"\$\{([A-Za-z_]\w*)\}", lambda m: env[m[1]], word))
    return argv


@pytest.fixture(scope="module")
def systemd_dir(deploy_dir: Path) -> Path:
    return deploy_dir / "systemd"


@pytest.fixture(scope="module")
def units(systemd_dir: Path) -> dict[str, configparser.ConfigParser]:
    return {service: read_unit(systemd_dir / name) for service, name in UNITS.items()}


@pytest.fixture(scope="module", params=ENV_FILES)
def env(request: pytest.FixtureRequest, systemd_dir: Path) -> dict[str, str]:
    return read_env_file(systemd_dir / request.param)


def test_every_unit_has_unit_service_and_install_sections(
    units: dict[str, configparser.ConfigParser],
) -> None:
    for name, unit in units.items():
        assert {"Unit", "Service", "Install"} <= set(unit.sections()), name
        assert unit["Install"]["WantedBy"] == "multi-user.target", name


def test_units_read_the_shared_environment_file(
    units: dict[str, configparser.ConfigParser],
) -> None:
    files = {unit["Service"]["EnvironmentFile"] for unit in units.values()}
    assert files == {"/etc/grpo-stream/env"}


def test_units_restart_on_failure_and_stop_with_sigterm(
    units: dict[str, configparser.ConfigParser],
) -> None:
    for name, unit in units.items():
        service = unit["Service"]
        assert (service["Restart"], service["KillSignal"]) == ("on-failure", "SIGTERM"), name


def test_trainer_gets_the_longest_stop_timeout_for_its_final_checkpoint(
    units: dict[str, configparser.ConfigParser],
) -> None:
    timeouts = {name: int(u["Service"]["TimeoutStopSec"]) for name, u in units.items()}
    assert timeouts["trainer"] >= 600
    assert max(timeouts, key=lambda name: timeouts[name]) == "trainer"


def test_generator_instance_selects_its_gpu(
    units: dict[str, configparser.ConfigParser],
) -> None:
    assert "CUDA_VISIBLE_DEVICES=%i" in units["generator"]["Service"]["Environment"].split("\n")


def test_exec_start_runs_the_unit_service_with_real_cli_options(
    units: dict[str, configparser.ConfigParser], env: dict[str, str], cli: Any
) -> None:
    for service, unit in units.items():
        argv = exec_argv(unit, env)
        assert Path(argv[0]).is_absolute()
        assert cli.parse_run(argv).service == service


def test_hub_config_binds_the_port_in_the_address_clients_dial(
    units: dict[str, configparser.ConfigParser], env: dict[str, str], cli: Any
) -> None:
    cfg = cli.hub_config(cli.parse_run(exec_argv(units["grouper"], env)))
    dialled = {
        cli.parse_run(exec_argv(units[s], env)).params["hub"] for s in UNITS if s != "grouper"
    }
    assert dialled == {cfg.hub.public_address}
    assert cli.port_of(cfg.hub.bind) == cli.port_of(cfg.hub.public_address)
    assert cfg.trainer.public_host == env["GRPO_TRAINER_HOST"]
    assert cli.port_of(cfg.trainer.bind) == int(env["GRPO_TRAINER_PORT"])


def test_curve_environment_gives_every_service_the_hosts_keys_directory(
    units: dict[str, configparser.ConfigParser], systemd_dir: Path, cli: Any
) -> None:
    env = read_env_file(systemd_dir / "env.curve.example")
    dirs = {cli.parse_run(exec_argv(units[s], env)).params["keys_dir"] for s in UNITS}
    assert dirs == {Path("/etc/grpo-stream/keys")}


def test_every_unit_loads_the_run_secret_as_a_credential_and_passes_it(
    units: dict[str, configparser.ConfigParser], env: dict[str, str], cli: Any
) -> None:
    for service, unit in units.items():
        assert unit["Service"]["LoadCredential"] == "secret:/etc/grpo-stream/secret", service
        params = cli.parse_run(exec_argv(unit, env)).params
        assert params["secret_file"] == Path(CREDENTIALS) / "secret", service


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_analyze_finds_nothing_but_the_uninstalled_executable(systemd_dir: Path) -> None:
    paths = [str(systemd_dir / name) for name in UNITS.values()]
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", "--generators=no", *paths],
        capture_output=True,
        text=True,
        timeout=30,
    )
    complaints = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if line.strip() and "/opt/grpo-stream/venv/bin/grpo-stream is not executable" not in line
    ]
    assert complaints == []
