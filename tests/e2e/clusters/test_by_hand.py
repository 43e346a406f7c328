"""The operating guide's multi-host example, as written, across three network namespaces.

docs/guide/operating.md says what a run started service by service needs across hosts: a
`run.toml` fragment (the hub and the trainer's weight server bound where other hosts reach
them, the run's secret) and one `grpo-stream ...` command per host. This test reads both from
the page, puts `HUB` and `TRAINER` on the addresses of two namespaces, gives every "host" its
own copy of the two files (as the page says), and runs hub and scorer on cl-h1, the trainer
on cl-h2 and a generator on cl-h3: the generator fetches every version from the trainer on
another host, and the run trains its steps. About 60-120 s.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_stream.training.metrics import read_metrics

from ..conftest import SMALL
from .conftest import events
from .netns import Node, cluster_lock, kill_pids, nodes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
GUIDE = Path(__file__).parents[3] / "docs" / "guide" / "operating.md"
ADDRS = {"cl-h1": "10.201.0.41", "cl-h2": "10.201.0.42", "cl-h3": "10.201.0.43"}
STEPS = 3


def guide_example() -> tuple[str, list[str]]:
    """The page's multi-host run.toml fragment and its `grpo-stream` commands (one a line,
    comments dropped, the evaluator's left out: eval is off)."""
    text = GUIDE.read_text(encoding="utf-8")
    toml = re.search(r"```toml\n(\[hub\].*?)```", text, re.DOTALL)
    block = re.search(r"```bash\n(grpo-stream keys secret .*?)```", text, re.DOTALL)
    assert toml is not None and block is not None, "the multi-host example left the guide"
    commands = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines()]
    return toml.group(1), [c for c in commands if c and "evaluator" not in c]


def _argv(command: str) -> list[str]:
    words = command.split()
    assert words[0] == "grpo-stream", command
    return [sys.executable, "-m", "grpo_stream.cli.main", *words[1:]]


def _host(service: str) -> str:
    return {"grouper": "cl-h1", "scorer": "cl-h1", "trainer": "cl-h2"}.get(service, "cl-h3")


def test_the_guides_multi_host_example_trains_across_hosts(tmp_path: Path) -> None:
    fragment, commands = guide_example()
    fragment = fragment.replace("HUB", ADDRS["cl-h1"]).replace("TRAINER", ADDRS["cl-h2"])
    commands = [c.replace("HUB", ADDRS["cl-h1"]) for c in commands]
    keys, services = commands[0], commands[1:]
    assert [c.split()[2] for c in services] == ["grouper", "trainer", "generator", "scorer"]
    shared = tmp_path / "made"
    shared.mkdir()
    (shared / "run.toml").write_text(fragment)
    subprocess.run(_argv(keys), cwd=shared, check=True, capture_output=True, timeout=120)
    small = [*SMALL, "--set", f"run.max_steps={STEPS}", "--set", "trainer.checkpoint_every=100"]
    procs: list[tuple[str, subprocess.Popen[bytes]]] = []
    (tmp_path / "cluster").mkdir()
    with cluster_lock(), nodes(tmp_path / "cluster", ADDRS) as made:
        by_name: dict[str, Node] = {node.name: node for node in made}
        try:
            for command in services:
                service = command.split()[2]
                home = tmp_path / "hosts" / f"{service}-{_host(service)}"
                home.mkdir(parents=True)
                for name in ("run.toml", "run.secret"):  # each host its own copy
                    shutil.copy2(shared / name, home / name)
                argv = _argv(command) + (small if service == "grouper" else [])
                with (home / "console.log").open("wb") as log:
                    popen = subprocess.Popen(
                        by_name[_host(service)].command(argv),
                        cwd=home,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                procs.append((service, popen))
                if service == "grouper":
                    _wait_for(home / "runs" / "default" / "hub.addr", procs, tmp_path)
            trainer = dict(procs)["trainer"]
            assert trainer.wait(timeout=420) == 0, _consoles(tmp_path)
        finally:
            kill_pids([p.pid for _, p in procs])
            for _, proc in procs:
                proc.wait(timeout=30)
    trainer_dir = tmp_path / "hosts" / "trainer-cl-h2" / "runs" / "default"
    assert [row["step"] for row in read_metrics(trainer_dir)] == list(range(1, STEPS + 1))
    generator_dir = tmp_path / "hosts" / "generator-cl-h3" / "runs" / "default"
    applied = [int(e["version"]) for e in events(generator_dir, "generator", "weights.applied")]
    assert applied and max(applied) >= STEPS - 1, _consoles(tmp_path)  # fetched from cl-h2
    hub_dir = tmp_path / "hosts" / "grouper-cl-h1" / "runs" / "default"
    joined = {(e["service"], e["host"]) for e in events(hub_dir, "grouper", "peer.joined")}
    assert {("trainer", "cl-h2"), ("generator", "cl-h3"), ("scorer", "cl-h1")} <= joined


def _wait_for(path: Path, procs: list[tuple[str, subprocess.Popen[bytes]]], root: Path) -> None:
    deadline = time.monotonic() + 180
    while not path.exists():
        if time.monotonic() > deadline or any(p.poll() is not None for _, p in procs):
            raise AssertionError(f"the hub did not start:\n{_consoles(root)}")
        time.sleep(0.2)


def _consoles(root: Path) -> str:
    return "\n".join(
        f"--- {path.parent.name}\n{path.read_text(errors='replace')[-1500:]}"
        for path in sorted((root / "hosts").glob("*/console.log"))
    )
