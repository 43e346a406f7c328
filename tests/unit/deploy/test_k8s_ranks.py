"""deploy/k8s/ranks: trainer ranks across pods. The StatefulSet's torchrun line is parsed by
torchrun's own parser and its program by the real CLI; the hub's config (base + the overlay's
patches, applied here and, where kubectl is installed, by `kubectl kustomize`) must point
generators at rank 0's pod and count every rank."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

Objects = dict[tuple[str, str], dict[str, Any]]
STS = ("StatefulSet", "grpo-stream-trainer")


def _load(directory: Path) -> Objects:
    out: Objects = {}
    for path in sorted(directory.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            for doc in yaml.safe_load_all(path.read_text()):
                out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def overlay(k8s: Path) -> Objects:
    """Base + ranks: its resources added, its delete patch and its `add` ops applied."""
    spec = yaml.safe_load((k8s / "ranks" / "kustomization.yaml").read_text())
    out = copy.deepcopy(_load(k8s / "base"))
    for resource in spec["resources"][1:]:
        for doc in yaml.safe_load_all((k8s / "ranks" / resource).read_text()):
            out[(doc["kind"], doc["metadata"]["name"])] = doc
    for patch in spec["patches"]:
        body = yaml.safe_load(patch["patch"])
        if isinstance(body, dict) and body.get("$patch") == "delete":
            del out[(body["kind"], body["metadata"]["name"])]
            continue
        args = out[(patch["target"]["kind"], patch["target"]["name"])]["spec"]["template"]
        for op in body:
            assert (op["op"], op["path"]) == ("add", "/spec/template/spec/containers/0/args/-")
            args["spec"]["containers"][0]["args"].append(op["value"])
    return out


def _container(objects: Objects, kind: str, name: str) -> dict[str, Any]:
    (only,) = objects[(kind, name)]["spec"]["template"]["spec"]["containers"]
    return only


@pytest.fixture(scope="module")
def objects(deploy_dir: Path) -> Objects:
    return overlay(deploy_dir / "k8s")


@pytest.fixture(scope="module")
def nodes(objects: Objects) -> dict[str, Any]:
    return objects[("StatefulSet", "grpo-stream-trainer")]


def _torchrun(nodes: dict[str, Any], pod_index: int) -> tuple[Any, list[str]]:
    """torchrun's parsed options and its program, $(VAR)s expanded as the kubelet would."""
    from torch.distributed.run import get_args_parser

    c = nodes["spec"]["template"]["spec"]["containers"][0]
    values = {"POD_INDEX": str(pod_index), "POD_NAME": f"grpo-stream-trainer-{pod_index}"}
    words = [w.replace("$(POD_INDEX)", values["POD_INDEX"]) for w in c["args"]]
    words = [w.replace("$(POD_NAME)", values["POD_NAME"]) for w in words]
    assert c["command"] == ["torchrun"]
    args = get_args_parser().parse_args(words)
    return args, [args.training_script, *args.training_script_args]


def test_the_trainer_deployment_is_replaced_by_the_statefulset(objects: Objects) -> None:
    assert ("Deployment", "grpo-stream-trainer") not in objects
    assert (
        objects[("StatefulSet", "grpo-stream-trainer")]["spec"]["serviceName"]
        == (objects[("Service", "grpo-stream-trainer")]["metadata"]["name"])
    )


def test_each_pod_runs_one_rank_per_gpu_it_requests(nodes: dict[str, Any]) -> None:
    args, _ = _torchrun(nodes, 1)
    gpus = nodes["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert int(args.nnodes) == nodes["spec"]["replicas"]
    assert int(args.nproc_per_node) == gpus["nvidia.com/gpu"]
    assert args.node_rank == 1 and args.no_python


def test_the_node_rank_is_the_pod_index(nodes: dict[str, Any]) -> None:
    env = {e["name"]: e for e in nodes["spec"]["template"]["spec"]["containers"][0]["env"]}
    path = env["POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert path == "metadata.labels['apps.kubernetes.io/pod-index']"


def test_the_rendezvous_is_pod_zero_on_a_declared_port(
    objects: Objects, nodes: dict[str, Any]
) -> None:
    args, _ = _torchrun(nodes, 0)
    name, service = nodes["metadata"]["name"], nodes["spec"]["serviceName"]
    assert args.master_addr == f"{name}-0.{service}"
    ports = {p["name"]: p["containerPort"] for p in _container(objects, *STS)["ports"]}
    assert ports["rendezvous"] == args.master_port


def test_the_trainer_program_parses_with_the_cli(nodes: dict[str, Any], cli: Any) -> None:
    _, program = _torchrun(nodes, 0)
    params = cli.parse_run(program).params
    assert params["hub"] == "tcp://grpo-stream-hub:5555" and params["resume"]


def test_the_hub_sends_generators_to_rank_zero_and_counts_every_rank(
    objects: Objects, nodes: dict[str, Any], cli: Any, tmp_path: Path
) -> None:
    args, _ = _torchrun(nodes, 0)
    run_toml = tmp_path / "run.toml"
    run_toml.write_text(objects[("ConfigMap", "grpo-stream-config")]["data"]["run.toml"])
    hub_container = _container(objects, "Deployment", "grpo-stream-hub")
    hub = cli.parse_run([*hub_container["command"], *hub_container["args"]])
    cfg = cli.hub_config(hub, run_toml)
    assert cfg.trainer.public_host == args.master_addr
    assert cfg.trainer.ranks == int(args.nnodes) * int(args.nproc_per_node)
    assert cfg.trainer.rendezvous_port == args.master_port


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (kustomize)")
def test_kubectl_kustomize_renders_the_overlay_as_applied_here(
    objects: Objects, deploy_dir: Path, tmp_path: Path
) -> None:
    shutil.copytree(deploy_dir / "k8s", tmp_path / "k8s")
    (tmp_path / "k8s" / "base" / "run.secret").write_text("ab" * 32 + "\n")  # its generator's
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(tmp_path / "k8s" / "ranks")],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    by_key = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(rendered)}
    assert {k for k in by_key if k[0] != "Secret"} == set(objects)
    hub = ("Deployment", "grpo-stream-hub")
    assert _container(by_key, *hub)["args"] == _container(objects, *hub)["args"]
    sts = ("StatefulSet", "grpo-stream-trainer")
    assert _container(by_key, *sts)["args"] == _container(objects, *sts)["args"]
