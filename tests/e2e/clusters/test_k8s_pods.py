"""deploy/k8s started as written, pod by pod (k8spods.py: no Kubernetes here), while strangers
try to register at the hub's Service.

The user's steps first, in a copy of deploy/k8s: `grpo-stream keys secret base/run.secret`
and, for the CURVE overlay, `grpo-stream keys init curve/keys`; then each Deployment's pod
(one replica each) with the ConfigMap's run.toml swapped for a tiny run (the shipped one
names a 0.5B model under vLLM on a GPU).
- base: the run secret reaches every pod through the Secret (GRPO_STREAM_SECRET); a
  stranger without it is refused; no pod shows the secret on a command line; the hub's state
  and the trainer's checkpoints each stay on their own volume.
- curve: each pod holds only its role's keys; a plaintext stranger and one with a key of its
  own get no answer; one holding the generator pod's keys (and no secret) cannot say Hello
  as a scorer.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.auth

from grpo_stream.protocols import messages as m
from grpo_stream.protocols.codec import decode, encode

from ...unit.deploy.test_k8s import apply_overlay, generated_secrets, load_objects
from ..conftest import metrics
from .conftest import events, stranger_hello
from .k8spods import Objects, Pod, hosts_of_services, start_pod
from .netns import cluster_lock, nodes

K8S = Path(__file__).parents[3] / "deploy" / "k8s"
PODS = {"hub": "10.201.0.31", "trainer": "10.201.0.32", "generator": "10.201.0.33",
        "scorer": "10.201.0.34"}  # fmt: skip
STEPS = 10
CONFIG = f"""[run]
max_steps = {STEPS}
[hub]
groups_per_step = 2
[generator]
group_size = 4
prompts_per_request = 2
"""
NO_ANSWER_MS = 3000

UNDER_TMP = [str(p) for p in (K8S.parents[1], Path(sys.prefix)) if p.is_relative_to("/tmp")]
"""A checkout or environment under /tmp: a pod's /tmp is an empty tmpfs (k8spods.py), so the
"image" would lack it (the pods fail to execute grpo-stream)."""

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        bool(UNDER_TMP), reason=f"{UNDER_TMP} under /tmp, which each pod sees empty"
    ),
]


def _cli(*argv: str) -> None:
    subprocess.run([sys.executable, "-m", "grpo_stream.cli.main", *argv], check=True,
                   capture_output=True, timeout=120)  # fmt: skip


def rendered(root: Path, overlay: str | None) -> Objects:
    """The user's steps in a copy of deploy/k8s, then the objects `kubectl apply -k` sends."""
    k8s = root / "k8s"
    shutil.copytree(K8S, k8s)
    _cli("keys", "secret", str(k8s / "base" / "run.secret"))
    base = load_objects(k8s / "base") | generated_secrets(k8s / "base" / "kustomization.yaml")
    base[("ConfigMap", "grpo-stream-config")]["data"]["run.toml"] = CONFIG
    if overlay is None:
        return base
    _cli("keys", "init", str(k8s / overlay / "keys"))
    return apply_overlay(base, k8s / overlay / "kustomization.yaml")


@dataclass
class Ran:
    objects: Objects
    pods: dict[str, Pod]
    trainer_rc: int
    replies: dict[str, m.Message | None]
    cmdlines: list[str]
    logs: str

    def run_dir(self, component: str) -> Path:
        return self.pods[component].volume("run") / "run"


def _cmdlines(pods: dict[str, Pod]) -> list[str]:
    out = []
    for pod in pods.values():
        for pid in pod.node.pids():
            try:
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue
    return out


def _wait_hub(pod: Pod, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not (pod.volume("run") / "run" / "hub.addr").exists():
        if pod.proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"the hub pod did not start:\n{pod.log.read_text()[-3000:]}")
        time.sleep(0.2)


def run_pods(root: Path, objects: Objects, knock: Any) -> Ran:
    """Every pod, the strangers (`knock(hub_address, objects, pods)`) once the hub is up,
    until the trainer exits; then the rest are stopped as `kubectl delete` would."""
    services = hosts_of_services(objects, PODS)
    with nodes(root, {f"cl-k{c[:3]}": a for c, a in PODS.items()}) as made:
        by_addr = {n.addr: n for n in made}
        pods: dict[str, Pod] = {}
        try:
            for component, addr in PODS.items():
                pods[component] = start_pod(objects, component, by_addr[addr], services, root)
                if component == "hub":
                    _wait_hub(pods["hub"])
            replies = knock(f"tcp://{PODS['hub']}:5555", objects, pods)
            cmdlines = _cmdlines(pods)
            rc = pods["trainer"].proc.wait(timeout=420)
        finally:
            for pod in pods.values():
                pod.stop()
        logs = "\n".join(f"{c}: {p.log.read_text()[-1500:]}" for c, p in pods.items())
        return Ran(objects, pods, rc, replies, cmdlines, logs)


def _no_secret(address: str, objects: Objects, pods: dict[str, Pod]) -> dict[str, Any]:
    return {"stranger": stranger_hello(address)}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Ran:
    root = tmp_path_factory.mktemp("k8s-base")
    with cluster_lock():
        return run_pods(root, rendered(root, None), _no_secret)


def _completes(ran: Ran) -> None:
    assert ran.trainer_rc == 0, ran.logs
    assert [r["step"] for r in metrics(ran.run_dir("trainer"))] == list(range(1, STEPS + 1))
    joined = {e["service"] for e in events(ran.run_dir("hub"), "grouper", "peer.joined")}
    assert joined == {"trainer", "generator", "scorer"}, ran.logs


def test_base_pods_train_to_the_end(base: Ran) -> None:
    _completes(base)


def test_base_refuses_a_stranger_without_the_secret(base: Ran) -> None:
    reply = base.replies["stranger"]
    assert isinstance(reply, m.Error) and reply.code == "bad_hello", reply
    hosts = {e["host"] for e in events(base.run_dir("hub"), "grouper", "peer.joined")}
    assert "stranger" not in hosts


def test_the_secret_reaches_pods_only_through_the_secret_object(base: Ran) -> None:
    secret = base.objects[("Secret", "grpo-stream-secret")]["data"]["secret"]
    value = base64.b64decode(secret).decode().strip()
    assert base.cmdlines and not [c for c in base.cmdlines if value in c]


def test_state_stays_on_each_pods_own_volume(base: Ran) -> None:
    trainer, hub = base.run_dir("trainer"), base.run_dir("hub")
    assert (trainer / "checkpoints" / f"step-{STEPS}" / "COMPLETE").exists()
    assert not (hub / "checkpoints").exists()
    assert (hub / "hub").is_dir() and not (trainer / "hub").exists()


# ----- the CURVE overlay: one key set per role ----------------------------------------------
def curve_hello(address: str, keys: tuple[bytes, bytes, bytes] | None, service: str) -> Any:
    """A Hello (no secret) over CURVE with `keys` (public, secret, server), or plaintext."""
    ctx: zmq.Context[Any] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = keys
    hello = m.Hello(service=service, instance=f"{service}-stranger", host="stranger", pid=1,
                    capacity=4)  # fmt: skip
    try:
        sock.connect(address)
        sock.send_multipart([bytes(f) for f in encode(hello)])
        return decode(sock.recv_multipart()) if sock.poll(NO_ANSWER_MS) else None
    finally:
        sock.close()
        ctx.term()


def _curve_strangers(address: str, objects: Objects, pods: dict[str, Pod]) -> dict[str, Any]:
    keys = pods["generator"].volume("keys")  # what a compromised generator pod holds
    server, _ = zmq.auth.load_certificate(str(keys / "server.key"))
    public, secret = zmq.auth.load_certificate(str(keys / "generator.key_secret"))
    assert secret is not None
    own = zmq.curve_keypair()
    return {
        "plaintext": curve_hello(address, None, "scorer"),
        "own_key": curve_hello(address, (*own, server), "scorer"),
        "generator_key": curve_hello(address, (public, secret, server), "scorer"),
    }


@pytest.fixture(scope="module")
def curve(tmp_path_factory: pytest.TempPathFactory) -> Ran:
    root = tmp_path_factory.mktemp("k8s-curve")
    with cluster_lock():
        return run_pods(root, rendered(root, "curve"), _curve_strangers)


def test_curve_pods_train_to_the_end(curve: Ran) -> None:
    _completes(curve)
    assert events(curve.run_dir("hub"), "grouper", "curve.authenticator_started")


def test_curve_strangers_get_no_answer_or_a_refusal(curve: Ran) -> None:
    assert curve.replies["plaintext"] is None
    assert curve.replies["own_key"] is None
    refused = curve.replies["generator_key"]
    assert isinstance(refused, m.Error), refused
    hosts = {e["host"] for e in events(curve.run_dir("hub"), "grouper", "peer.joined")}
    assert "stranger" not in hosts


def test_each_pod_holds_only_its_roles_secret_key(curve: Ran) -> None:
    held = {c: sorted(p.name for p in pod.volume("keys").rglob("*_secret"))
            for c, pod in curve.pods.items()}  # fmt: skip
    assert held == {
        "hub": ["server.key_secret"],
        "trainer": ["server.key_secret", "trainer.key_secret"],
        "generator": ["generator.key_secret"],
        "scorer": ["scorer.key_secret"],
    }
