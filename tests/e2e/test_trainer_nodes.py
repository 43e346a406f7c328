"""Trainer ranks across hosts: two network namespaces as trainer hosts, one gloo rank each,
started the way `up` starts trainer nodes (torchrun multi-node with static rendezvous on the
first host, the rendezvous wait on the second, the `prefix` launcher), end one step with the
same parameters as one process training on the whole step.

The ranks run tests/unit/training/test_ddp.py (each trains its shard of one fixed step);
the namespaces i13PIDn1 / i13PIDn2 are joined by one veth pair on 192.168.113.0/24, exist
only for this test and are deleted after it (and when a killed run left them behind).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from grpo_stream.config import load_config
from grpo_stream.config.cluster import ClusterHost
from grpo_stream.launch.cluster import place
from grpo_stream.launch.placed import trainer_node_argv
from grpo_stream.launch.placement import Placement, Slot
from grpo_stream.launch.supervisor import ServiceSpec, Supervisor

DDP = Path(__file__).parents[1] / "unit" / "training" / "test_ddp.py"
pytestmark = [
    pytest.mark.slow,  # two torchrun nodes loading the model, then one process
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2 `ip` is missing"),
]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _delete(owned_by: Callable[[int], bool]) -> None:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        match = re.match(r"i13(\d+)n[12]\b", line)
        if match and owned_by(int(match.group(1))):
            subprocess.run(["ip", "netns", "delete", match.group(0)], check=False, timeout=30)


@pytest.fixture(scope="module")
def hosts() -> Iterator[list[ClusterHost]]:
    """Two namespaces joined by a veth pair, as two trainer hosts of a cluster."""
    _delete(lambda pid: not Path(f"/proc/{pid}").exists())
    tag = str(os.getpid())
    names, links = [f"i13{tag}n1", f"i13{tag}n2"], [f"vi13{tag}a", f"vi13{tag}b"]
    try:
        try:
            for ns in names:
                _ip("netns", "add", ns)
                _ip("-n", ns, "link", "set", "lo", "up")
            _ip("link", "add", links[0], "type", "veth", "peer", "name", links[1])
        except subprocess.CalledProcessError as exc:
            if b"not permitted" in (exc.stderr or b""):
                pytest.skip(f"cannot create network namespaces here: {exc.stderr!r}")
            raise
        out = []
        for i, (ns, link) in enumerate(zip(names, links, strict=True), start=1):
            _ip("link", "set", link, "netns", ns)
            _ip("-n", ns, "addr", "add", f"192.168.113.{i}/24", "dev", link)
            _ip("-n", ns, "link", "set", link, "up")
            out.append(
                ClusterHost(
                    name=f"t{i}",
                    address=f"192.168.113.{i}",
                    launcher="prefix",
                    prefix=["ip", "netns", "exec", ns],
                    env={"GLOO_SOCKET_IFNAME": link, "OMP_NUM_THREADS": "1"},
                    services={"trainer": 1},
                )
            )
        yield out
    finally:
        _delete(lambda pid: pid == os.getpid())


def _ddp_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ddp_reference", DDP)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_nodes(hosts: list[ClusterHost], out: Path) -> None:
    cfg = load_config(None, [])
    placement = Placement("none", (Slot("t1"), Slot("t2")), ())
    master = (hosts[0].address, cfg.trainer.rendezvous_port)
    sup = Supervisor()
    env = {k: os.environ[k] for k in ("WORLD_SIZE", "RANK") if k in os.environ}
    assert not env, "the test must not run inside torchrun"
    for i, host in enumerate(hosts):
        argv = trainer_node_argv(cfg, placement, i, master, [sys.executable, str(DDP), str(out)])
        sup.start(place(host, ServiceSpec(f"trainer-0-n{i}", "trainer", argv)))
    deadline = time.monotonic() + 240
    codes: dict[str, int] = {}
    try:
        while len(codes) < len(hosts) and time.monotonic() < deadline:
            sup.drain(0.2)
            for proc, code in sup.exited():
                codes[proc.spec.instance] = code
                assert code == 0, f"{proc.spec.instance} exited {code}: {list(proc.tail)[-5:]}"
    finally:
        sup.stop_all(grace_s=5)
    assert len(codes) == len(hosts), "trainer nodes did not finish in 240 s"


def test_two_trainer_hosts_end_a_step_with_the_parameters_of_one_process(
    hosts: list[ClusterHost], tmp_path: Path
) -> None:
    import torch
    from safetensors.torch import load_file

    from grpo_stream.training.state import TrainState

    _run_nodes(hosts, tmp_path)
    ddp = _ddp_module()  # its main is trainstates.train_rank; the helpers are trainstates'
    states = sys.modules["trainstates"]
    torch.set_num_threads(1)
    single = TrainState.create(ddp._config(tmp_path / "single"))
    before = states.params_of(single)
    assert single.train_step(states.step_and_shards(ddp.GROUPS, ddp.WORLD)[0]).applied
    after = states.params_of(single)
    nodes = load_file(str(tmp_path / "rank0.safetensors"))
    assert any(not torch.equal(before[n], after[n]) for n in after)  # the step moved weights
    for name, value in after.items():
        torch.testing.assert_close(nodes[name], value, rtol=1e-5, atol=1e-6, msg=name)
