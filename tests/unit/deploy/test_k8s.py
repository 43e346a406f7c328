"""deploy/k8s: manifests parsed, container command lines checked against the real CLI, and the
Services, ports, volumes and the CURVE overlay checked against what the commands bind and read.

Container args are expanded as the kubelet does ($(VAR) from the container's env, a fieldRef
standing for the pod's name). The CURVE overlay's JSON patches (only `add` is used) are applied
here; where kubectl is installed, `kubectl kustomize` must render the same thing.
"""

from __future__ import annotations

import base64
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


def generated_secrets(kustomization: Path) -> Objects:
    """The Secrets a kustomization's secretGenerator makes (files read relative to it; the
    name suffix kustomize adds is left out, as are the references it rewrites)."""
    spec = yaml.safe_load(kustomization.read_text())
    out: Objects = {}
    for gen in spec.get("secretGenerator", []):
        data = {}
        for entry in gen["files"]:
            key, _, path = entry.partition("=")
            data[key] = base64.b64encode((kustomization.parent / path).read_bytes()).decode()
        meta = {"name": gen["name"]}
        out[("Secret", gen["name"])] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": meta,
            "data": data,
        }
    return out


def apply_overlay(base: Objects, kustomization: Path) -> Objects:
    spec = yaml.safe_load(kustomization.read_text())
    assert spec["resources"] == ["../base"]
    out = copy.deepcopy(base) | generated_secrets(kustomization)
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
        ["ConfigMap", *["PersistentVolumeClaim"] * 2, *["Deployment"] * 4, "Service", "Service"]
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


def test_hub_and_trainer_keep_the_run_directory_each_on_its_own_claim(
    objects: Objects, hub_cfg: Any
) -> None:
    """No volume is shared between pods: hub state on one claim, checkpoints on another."""
    claimed = {}
    for component in COMPONENTS:
        volumes = deployment(objects, component)["spec"]["template"]["spec"]["volumes"]
        by_name = {v["name"]: v for v in volumes}
        for m in container(objects, component).get("volumeMounts", []):
            claim = by_name[m["name"]].get("persistentVolumeClaim", {}).get("claimName")
            if claim:
                assert claim not in claimed, f"{claim} is mounted by {claimed.get(claim)} too"
                claimed[claim] = component
                assert hub_cfg.run.run_dir.is_relative_to(m["mountPath"]), component
                spec = objects[("PersistentVolumeClaim", claim)]["spec"]
                assert spec["accessModes"] == ["ReadWriteOnce"]
    assert claimed == {"grpo-stream-hub": "hub", "grpo-stream-trainer": "trainer"}


def test_every_pod_can_write_the_run_directory_the_hub_hands_out(
    objects: Objects, hub_cfg: Any
) -> None:
    """Every service logs under the hub's run.run_dir; the image has no such directory and
    its user cannot make one at /, so each pod mounts a writable volume above it."""
    for component in COMPONENTS:
        mounts = container(objects, component).get("volumeMounts", [])
        writable = [m["mountPath"] for m in mounts if not m.get("readOnly")]
        assert any(hub_cfg.run.run_dir.is_relative_to(w) for w in writable), component


def test_every_service_gets_the_run_secret_from_the_secret_in_its_environment(
    objects: Objects, k8s_dir: Path
) -> None:
    from grpo_stream.transport.runsecret import SECRET_ENV

    spec = yaml.safe_load((k8s_dir / "base" / "kustomization.yaml").read_text())
    (gen,) = spec["secretGenerator"]
    assert gen["files"] == ["secret=run.secret"]
    for component in COMPONENTS:
        env = {e["name"]: e for e in container(objects, component)["env"]}
        ref = env[SECRET_ENV]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == (gen["name"], "secret"), component
        assert "--secret-file" not in argv_of(container(objects, component))


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


@pytest.fixture(scope="module")
def keyed_k8s(k8s_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of deploy/k8s with the files its generators read: `keys init` keys and a secret."""
    from grpo_stream.transport.curve import init_keys

    root = tmp_path_factory.mktemp("k8s-keys") / "k8s"
    shutil.copytree(k8s_dir, root)
    init_keys(root / "curve" / "keys")
    (root / "base" / "run.secret").write_text("ab" * 32 + "\n")
    return root


@pytest.fixture(scope="module")
def curved(objects: Objects, keyed_k8s: Path) -> Objects:
    return apply_overlay(objects, keyed_k8s / "curve" / "kustomization.yaml")


def mounted_keys(curved: Objects, component: str, root: Path) -> Path:
    """The /keys directory `component`'s pod sees: its Secret's items at their paths."""
    volumes = deployment(curved, component)["spec"]["template"]["spec"]["volumes"]
    (keys,) = [v for v in volumes if v["name"] == "keys"]
    data = curved[("Secret", keys["secret"]["secretName"])]["data"]
    out = root / component
    for item in keys["secret"]["items"]:
        (out / item["path"]).parent.mkdir(parents=True, exist_ok=True)
        (out / item["path"]).write_bytes(base64.b64decode(data[item["key"]]))
    return out


def test_curve_overlay_gives_each_role_only_its_own_keys(
    curved: Objects, run_toml: Path, cli: Any, tmp_path: Path
) -> None:
    from grpo_stream.launch.shipping import role_key_files

    for component in COMPONENTS:
        cmd = cli.parse_run(argv_of(container(curved, component)))
        assert cmd.params["keys_dir"] == Path("/keys"), component
        mounts = {m["name"]: m["mountPath"] for m in container(curved, component)["volumeMounts"]}
        assert mounts["keys"] == "/keys", component
        keys = mounted_keys(curved, component, tmp_path)
        secrets = {p.name for p in keys.glob("*.key_secret")}
        wanted = {f for f in role_key_files(SERVICE_OF[component], False) if "secret" in f}
        assert secrets == wanted, component


def test_curve_overlay_keys_work_with_the_transport(curved: Objects, tmp_path: Path) -> None:
    """The hub's mounted allow-list maps each role's mounted key to that role; each client
    loads its pair and the server's public key from its own mount."""
    from grpo_stream.transport.curve import key_roles, load_pair, server_public_key

    hub = mounted_keys(curved, "hub", tmp_path)
    roles = key_roles(hub)
    load_pair(hub, "server")
    for component in ("trainer", "generator", "scorer"):
        keys = mounted_keys(curved, component, tmp_path)
        public, _ = load_pair(keys, SERVICE_OF[component])
        assert roles[public.decode()] == SERVICE_OF[component], component
        assert server_public_key(keys) == server_public_key(hub)


def test_manifests_are_valid_kubernetes_objects(
    objects: Objects, curved: Objects, keyed_k8s: Path
) -> None:
    """Every object of the base, the CURVE overlay and the ranks overlay against the
    Kubernetes 1.30 schemas (kubernetes-validate ships them: offline), unknown fields refused."""
    import kubernetes_validate

    from .test_k8s_ranks import overlay as ranks_overlay

    base = objects | generated_secrets(keyed_k8s / "base" / "kustomization.yaml")
    checked = 0
    for rendered in (base, curved, ranks_overlay(keyed_k8s)):
        for (kind, name), doc in rendered.items():
            try:
                kubernetes_validate.validate(doc, "1.30.0", strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{kind}/{name}: {exc.message} at {list(exc.path)}")
            checked += 1
    assert checked >= 3 * 9


def test_the_validator_refuses_a_broken_manifest(objects: Objects) -> None:
    import kubernetes_validate

    broken = copy.deepcopy(deployment(objects, "hub"))
    broken["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.30.0", strict=True)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (kustomize)")
def test_kubectl_kustomize_renders_the_overlay_as_patched_here(
    objects: Objects, keyed_k8s: Path, curved: Objects
) -> None:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(keyed_k8s / "curve")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    by_key = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(rendered)}
    assert {k for k in by_key if k[0] != "Secret"} == set(objects)
    ours = curved
    for component in COMPONENTS:
        theirs = container(by_key, component)
        assert theirs["args"] == container(ours, component)["args"]
        assert theirs["volumeMounts"] == container(ours, component)["volumeMounts"]
        assert theirs["image"] == "grpo-stream:0.1.0"
