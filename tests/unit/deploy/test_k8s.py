"""deploy/k8s: manifests parsed, container command lines checked against the real CLI, and the
Services, ports, volumes and the CURVE overlay checked against what the commands bind and read.

Container args are expanded as the kubelet does ($(VAR) from the container's env, a fieldRef
standing for the pod's name). The CURVE overlay's JSON patches (only `add` is used) are applied
here; where kubectl is installed, `kubectl kustomize` must render the same thing.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

COMPONENTS = ("hub", "trainer", "generator", "scorer")
SERVICE_OF = {"hub": "grouper", "trainer": "trainer", "generator": "generator", "scorer": "scorer"}
Objects = dict[tuple[str, str], dict[str, Any]]


def load_objects(directory: Path) -> Objects:
    objects: Objects = {}
    for path in sorted(directory.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            objects[(doc["kind"], doc["metadata"]["name"])] = doc
    return objects


def deployment(objects: Objects, component: str) -> dict[str, Any]:
    return objects[("Deployment", f"grpo-stream-{component}")]


def container(objects: Objects, component: str) -> dict[str, Any]:
    containers: list[dict[str, Any]] = deployment(objects, component)["spec"]["template"]["spec"][
        "containers"
    ]
    (only,) = containers
    return only


def argv_of(c: dict[str, Any]) -> list[str]:
    """command + args with $(VAR) expanded from the container's env."""
    env = {e["name"]: e.get("value", f"pod-{e['name'].lower()}") for e in c.get("env", [])}
    return [
        re.sub(r"\$\(([A-Za-z_]\w*)\)", lambda m: env[m[1]], word)
        for word in [*c["command"], *c["args"]]
    ]


def json_patch_add(doc: dict[str, Any], path: str, value: Any) -> None:
    """RFC 6902 `add` (the only operation the overlay uses)."""
    *parents, last = path.lstrip("/").split("/")
    node: Any = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list) and last == "-":
        node.append(value)
    elif isinstance(node, list):
        node.insert(int(last), value)
    else:
        node[last] = value


def apply_overlay(base: Objects, kustomization: Path) -> Objects:
    spec = yaml.safe_load(kustomization.read_text())
    assert spec["resources"] == ["../base"]
    out = copy.deepcopy(base)
    for patch in spec["patches"]:
        target = patch["target"]
        hits = [
            key for key in out if key[0] == target["kind"] and re.fullmatch(target["name"], key[1])
        ]
        assert hits, f"patch target {target} matches nothing"
        for key in hits:
            for op in yaml.safe_load(patch["patch"]):
                assert op["op"] == "add", op
                json_patch_add(out[key], op["path"], op["value"])
    return out


@pytest.fixture(scope="module")
def k8s_dir(deploy_dir: Path) -> Path:
    return deploy_dir / "k8s"


@pytest.fixture(scope="module")
def objects(k8s_dir: Path) -> Objects:
    return load_objects(k8s_dir / "base")


@pytest.fixture(scope="module")
def run_toml(objects: Objects, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("k8s") / "run.toml"
    path.write_text(objects[("ConfigMap", "grpo-stream-config")]["data"]["run.toml"])
    return path


@pytest.fixture(scope="module")
def hub_cfg(objects: Objects, run_toml: Path, cli: Any) -> Any:
    return cli.hub_config(cli.parse_run(argv_of(container(objects, "hub"))), run_toml)


def test_every_manifest_is_a_named_kubernetes_object(objects: Objects) -> None:
    for (kind, name), doc in objects.items():
        assert doc["apiVersion"] and kind and name.startswith("grpo-stream")
    kinds = sorted(kind for kind, _ in objects)
    assert kinds == sorted(
        ["ConfigMap", "PersistentVolumeClaim", *["Deployment"] * 4, "Service", "Service"]
    )


def test_kustomization_lists_every_manifest(k8s_dir: Path) -> None:
    spec = yaml.safe_load((k8s_dir / "base" / "kustomization.yaml").read_text())
    files = {p.name for p in (k8s_dir / "base").glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(spec["resources"]) == sorted(files)


def test_configmap_holds_a_valid_run_config(run_toml: Path) -> None:
    from grpo_stream.config import load_config

    assert load_config(run_toml).generator.engine == "vllm"


def test_containers_run_their_service_with_real_cli_options(objects: Objects, cli: Any) -> None:
    for component in COMPONENTS:
        cmd = cli.parse_run(argv_of(container(objects, component)))
        assert cmd.service == SERVICE_OF[component]


def test_hub_service_exposes_the_port_the_hub_binds_and_clients_dial(
    objects: Objects, hub_cfg: Any, cli: Any
) -> None:
    service = objects[("Service", "grpo-stream-hub")]
    (port,) = service["spec"]["ports"]
    named = {p["name"]: p["containerPort"] for p in container(objects, "hub")["ports"]}
    assert port["port"] == named[port["targetPort"]] == cli.port_of(hub_cfg.hub.bind)
    assert hub_cfg.hub.public_address == f"tcp://grpo-stream-hub:{port['port']}"
    for component in ("trainer", "generator", "scorer"):
        dialled = cli.parse_run(argv_of(container(objects, component))).params["hub"]
        assert dialled == hub_cfg.hub.public_address, component


def test_trainer_service_is_headless_and_named_by_trainer_public_host(
    objects: Objects, hub_cfg: Any, cli: Any
) -> None:
    spec = objects[("Service", "grpo-stream-trainer")]["spec"]
    assert spec["clusterIP"] == "None"  # the announce port is random: clients need the pod IP
    assert hub_cfg.trainer.public_host == "grpo-stream-trainer"
    (port,) = spec["ports"]
    named = {p["name"]: p["containerPort"] for p in container(objects, "trainer")["ports"]}
    assert port["port"] == named[port["targetPort"]] == cli.port_of(hub_cfg.trainer.bind)


def test_services_select_their_own_deployment(objects: Objects) -> None:
    for component in ("hub", "trainer"):
        selector = objects[("Service", f"grpo-stream-{component}")]["spec"]["selector"]
        chosen = [
            name
            for (kind, name), doc in objects.items()
            if kind == "Deployment"
            and selector.items() <= doc["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert chosen == [f"grpo-stream-{component}"]


def test_only_trainer_and_generators_request_gpus(objects: Objects) -> None:
    gpus = {
        c: container(objects, c)["resources"].get("limits", {}).get("nvidia.com/gpu", 0)
        for c in COMPONENTS
    }
    assert gpus == {"hub": 0, "trainer": 1, "generator": 1, "scorer": 0}


def test_hub_and_trainer_mount_the_run_directory_from_the_claim(
    objects: Objects, hub_cfg: Any
) -> None:
    claim = objects[("PersistentVolumeClaim", "grpo-stream-run")]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    for component in ("hub", "trainer"):
        volumes = deployment(objects, component)["spec"]["template"]["spec"]["volumes"]
        by_name = {v["name"]: v for v in volumes}
        mounts = [
            m["mountPath"]
            for m in container(objects, component)["volumeMounts"]
            if by_name[m["name"]].get("persistentVolumeClaim", {}).get("claimName")
            == "grpo-stream-run"
        ]
        assert len(mounts) == 1 and hub_cfg.run.run_dir.is_relative_to(mounts[0]), component


def test_hub_reads_its_config_from_the_configmap(objects: Objects, cli: Any) -> None:
    c = container(objects, "hub")
    config = Path(cli.parse_run(argv_of(c)).params["config"])
    volumes = deployment(objects, "hub")["spec"]["template"]["spec"]["volumes"]
    maps = {v["name"]: v["configMap"]["name"] for v in volumes if "configMap" in v}
    (mount,) = [m for m in c["volumeMounts"] if m["name"] in maps]
    assert Path(mount["mountPath"]) == config.parent
    data = objects[("ConfigMap", maps[mount["name"]])]["data"]
    assert config.name in data


def test_trainer_gets_the_longest_grace_period_for_its_final_checkpoint(
    objects: Objects,
) -> None:
    grace = {
        c: deployment(objects, c)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        for c in COMPONENTS
    }
    assert grace["trainer"] >= 600
    assert max(grace, key=lambda c: grace[c]) == "trainer"


def test_curve_overlay_turns_encryption_on_with_keys_from_the_secret(
    objects: Objects, k8s_dir: Path, run_toml: Path, cli: Any
) -> None:
    curved = apply_overlay(objects, k8s_dir / "curve" / "kustomization.yaml")
    hub = cli.parse_run(argv_of(container(curved, "hub")))
    security = cli.hub_config(hub, run_toml).security
    assert security.curve and security.keys_dir == Path("/keys")
    for component in COMPONENTS:
        if component != "hub":
            cmd = cli.parse_run(argv_of(container(curved, component)))
            assert cmd.params["keys_dir"] == Path("/keys"), component
        volumes = deployment(curved, component)["spec"]["template"]["spec"]["volumes"]
        (keys,) = [v for v in volumes if v["name"] == "keys"]
        files = {item["path"] for item in keys["secret"]["items"]}
        # what grpo_stream.transport.curve reads: the server pair, the client pair, the allow-list
        assert files == {
            "server.key",
            "server.key_secret",
            "client.key",
            "client.key_secret",
            "authorized/client.key",
        }
        mounts = {m["name"]: m["mountPath"] for m in container(curved, component)["volumeMounts"]}
        assert mounts["keys"] == "/keys", component


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (kustomize)")
def test_kubectl_kustomize_renders_the_overlay_as_patched_here(
    objects: Objects, k8s_dir: Path
) -> None:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(k8s_dir / "curve")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    by_key = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(rendered)}
    assert set(by_key) == set(objects)
    ours = apply_overlay(objects, k8s_dir / "curve" / "kustomization.yaml")
    for component in COMPONENTS:
        theirs = container(by_key, component)
        assert theirs["args"] == container(ours, component)["args"]
        assert theirs["volumeMounts"] == container(ours, component)["volumeMounts"]
        assert theirs["image"] == "grpo-stream:0.1.0"
