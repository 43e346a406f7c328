"""`grpo-stream up --cluster` across three network namespaces (three "hosts").

gs-ns1 holds a bridge (192.168.77.1/24) and runs hub + trainer; gs-ns2 (.2) runs a generator
and gs-ns3 (.3) a scorer, each started by the `prefix` launcher (`ip netns exec`, plus
`unshare --uts` so each namespace has its own hostname). The subnet exists only inside the
namespaces this test creates; names carry the pid so a crashed run never blocks the next.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from grpo_stream.training.metrics import read_metrics

EXAMPLE = Path(__file__).parents[2] / "examples" / "cluster-netns.toml"
STEPS = 3

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2 `ip` is missing"),
    pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux `unshare` is missing"),
]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _build(tag: str) -> list[str]:
    """Three namespaces; veth pairs from ns2 and ns3 into a bridge in ns1."""
    names = [f"gs{tag}n{i}" for i in (1, 2, 3)]
    for ns in names:
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "set", "lo", "up")
    hub = names[0]
    _ip("-n", hub, "link", "add", "br0", "type", "bridge")
    _ip("-n", hub, "addr", "add", "192.168.77.1/24", "dev", "br0")
    _ip("-n", hub, "link", "set", "br0", "up")
    for i, ns in ((2, names[1]), (3, names[2])):
        near, far = f"v{tag}a{i}", f"v{tag}b{i}"  # interface names stay under 15 chars
        _ip("link", "add", near, "type", "veth", "peer", "name", far)
        _ip("link", "set", near, "netns", hub)
        _ip("link", "set", far, "netns", ns)
        _ip("-n", hub, "link", "set", near, "master", "br0")
        _ip("-n", hub, "link", "set", near, "up")
        _ip("-n", ns, "addr", "add", f"192.168.77.{i}/24", "dev", far)
        _ip("-n", ns, "link", "set", far, "up")
    return names


def _delete_namespaces(owned_by: Callable[[int], bool]) -> None:
    """Delete our namespaces (gsPIDnI) whose pid `owned_by` selects; their veths go too."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        match = re.match(r"gs(\d+)n[123]\b", line)
        if match and owned_by(int(match.group(1))):
            subprocess.run(["ip", "netns", "delete", match.group(0)], check=False, timeout=30)


def _dead(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


@pytest.fixture(scope="module")
def namespaces() -> Iterator[list[str]]:
    _delete_namespaces(_dead)  # left by a run that was killed before its cleanup
    try:
        try:
            names = _build(str(os.getpid()))
        except subprocess.CalledProcessError as exc:
            if b"not permitted" in (exc.stderr or b""):  # a sandbox without CAP_SYS_ADMIN
                pytest.skip(f"cannot create network namespaces here: {exc.stderr!r}")
            raise
        yield names
    finally:
        _delete_namespaces(lambda pid: pid == os.getpid())


@pytest.fixture(scope="module")
def finished_run(namespaces: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("netns")
    cluster = root / "cluster.toml"
    text = EXAMPLE.read_text()
    for i, ns in enumerate(namespaces, start=1):
        text = text.replace(f'"gs-ns{i}"', json.dumps(ns))
    cluster.write_text(text)
    run_dir = root / "run"
    cmd = [
        sys.executable, "-m", "grpo_stream.cli.main", "up", "--cluster", str(cluster),
        "--run-dir", str(run_dir), "--max-steps", str(STEPS),
        "--set", "hub.groups_per_step=4", "--set", "generator.group_size=4",
        "--set", "generator.prompts_per_request=4",
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return run_dir


def _hub_events(run_dir: Path, event: str) -> list[dict[str, object]]:
    out = []
    for path in (run_dir / "logs").glob("grouper*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("event") == event:
                out.append(row)
    return out


def test_run_across_namespaces_completes_every_step(finished_run: Path) -> None:
    assert [r["step"] for r in read_metrics(finished_run)] == list(range(1, STEPS + 1))


def test_generator_and_scorer_join_from_their_own_hosts(finished_run: Path) -> None:
    joined = {str(e["service"]): str(e["host"]) for e in _hub_events(finished_run, "peer.joined")}
    assert joined["generator"] == "gs-h2"
    assert joined["scorer"] == "gs-h3"
    assert joined["trainer"] == "gs-h1"


def test_hub_listens_on_the_bridge_address(finished_run: Path) -> None:
    assert (finished_run / "hub.addr").read_text().startswith("tcp://192.168.77.1:")
