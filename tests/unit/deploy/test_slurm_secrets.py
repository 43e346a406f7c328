"""deploy/slurm/grpo-stream.sbatch: the job's secret and CURVE keys reach every service, in
private files and never on a command line (the harness and the scenarios: slurm_harness.py).
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

from .slurm_harness import SlurmRun


def _secret_files(run: SlurmRun, cli: Any) -> dict[str, Path]:
    """Each started service's --secret-file, by its instance name."""
    out = {}
    for r in run.events("start"):
        params = cli.parse_run(r["argv"]).params
        out[params["instance"]] = Path(params["secret_file"])
    return out


def test_every_service_gets_the_jobs_secret_in_a_private_file(
    jobs: dict[str, SlurmRun], cli: Any
) -> None:
    files = _secret_files(jobs["three"], cli)
    assert len(files) == 8
    secrets = {path.read_text() for path in files.values()}
    assert len(secrets) == 1 and len(secrets.pop().strip()) == 64
    for path in files.values():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700, path.parent


def test_the_secret_is_on_no_command_line(jobs: dict[str, SlurmRun], cli: Any) -> None:
    secret = next(iter(_secret_files(jobs["three"], cli).values())).read_text().strip()
    assert not [r for r in jobs["three"].records if secret in " ".join(r["argv"])]
    assert secret not in jobs["three"].stderr


def test_each_start_makes_a_new_secret(jobs: dict[str, SlurmRun], cli: Any) -> None:
    first = next(iter(_secret_files(jobs["three"], cli).values())).read_text()
    other = next(iter(_secret_files(jobs["ranks"], cli).values())).read_text()
    assert first != other


def _keys(run: SlurmRun, cli: Any, service: str) -> set[str]:
    """Secret key files in the --keys-dir each `service` task got (one set for all)."""
    found = set()
    for r in run.starts(service):
        keys = Path(cli.parse_run(r["argv"]).params["keys_dir"])
        found.add(frozenset(p.name for p in keys.glob("*.key_secret")))
    assert len(found) == 1, found
    return set(found.pop())


def test_keys_dir_turns_curve_on_with_per_role_keys(jobs: dict[str, SlurmRun], cli: Any) -> None:
    assert jobs["one"].rc == 0, jobs["one"].stderr
    assert _keys(jobs["one"], cli, "grouper") == {"server.key_secret"}
    assert _keys(jobs["one"], cli, "trainer") == {"server.key_secret", "trainer.key_secret"}
    assert _keys(jobs["one"], cli, "generator") == {"generator.key_secret"}
    assert _keys(jobs["one"], cli, "scorer") == {"scorer.key_secret"}


def test_curve_keys_made_by_the_job_reach_every_role(jobs: dict[str, SlurmRun], cli: Any) -> None:
    run = jobs["scorer_node"]
    assert run.rc == 0, run.stderr
    assert _keys(run, cli, "grouper") == {"server.key_secret"}
    assert _keys(run, cli, "generator") == {"generator.key_secret"}
