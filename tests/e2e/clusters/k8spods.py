"""The pods of deploy/k8s run as written, without Kubernetes: each pod runs its container's
command and args with its env, its volumes at their mountPaths, as the image's user, in a
network namespace of its own on the test bridge (netns.py).

What stands in for Kubernetes is the least it takes:
- the objects are rendered as tests/unit/deploy/test_k8s.py renders them (kustomize's
  secretGenerator and the overlay's patches; compared with `kubectl kustomize` there when
  kubectl is installed);
- a pod: a network namespace, its own hostname (the pod's name), and a mount namespace whose
  root is a tmpfs holding this machine's top-level directories (bind mounts: the image), a
  copy of /etc with the pod's /etc/hosts, an empty /tmp (and, when this machine's Python is
  under a directory the image's user cannot enter, such as /root, that Python's tree alone
  there: `interpreter_tree`), and each volume at its mountPath: a
  PersistentVolumeClaim as a directory of its own, a ConfigMap or a Secret as its files
  (items at their paths, with defaultMode), an emptyDir as an empty directory. The process
  runs as uid 1000 with group 1000 (the image's USER; fsGroup 1000 owns the volumes), so it
  can write only to its volumes and /tmp, as in the image;
- env: `value`, `fieldRef` metadata.name (the pod's name), `secretKeyRef` (the Secret's data,
  in the process's environment only); `$(VAR)` in args expanded as the kubelet expands it;
- a Service: its name in every pod's /etc/hosts, with the address of the pod it selects
  (kube-proxy and the cluster DNS left out: ports are the same on the pod and the Service).
Not modelled: resources and GPUs, probes, the Deployment restarting a pod, replicas (the
test starts one pod per Deployment, as after `kubectl scale --replicas=1`).
"""

from __future__ import annotations

import base64
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .netns import Node, kill_pids

IMAGE_UID = 1000  # deploy/docker/Dockerfile: USER 1000 (group 1000); the pods' fsGroup
Objects = dict[tuple[str, str], dict[str, Any]]


@dataclass
class Pod:
    """One running pod: its Deployment's component, its node, its process."""

    component: str
    name: str
    node: Node
    volumes: dict[str, Path]
    """Volume name -> the directory on this host that holds it."""
    proc: subprocess.Popen[bytes]
    log: Path

    def volume(self, name: str) -> Path:
        return self.volumes[name]

    def stop(self, grace_s: float = 60.0) -> None:
        """SIGTERM (what the kubelet sends), SIGKILL after the grace period."""
        kill_pids([self.proc.pid], grace_s=grace_s)
        self.proc.wait(timeout=30)


def pod_spec(objects: Objects, component: str) -> dict[str, Any]:
    spec: dict[str, Any] = objects[("Deployment", f"grpo-stream-{component}")]["spec"]
    return spec["template"]["spec"]  # type: ignore[no-any-return]


def hosts_of_services(objects: Objects, pods: dict[str, str]) -> dict[str, str]:
    """Service name -> the address of the pod it selects (`pods`: component -> address)."""
    out = {}
    for (kind, name), doc in objects.items():
        if kind == "Service":
            component = doc["spec"]["selector"]["app.kubernetes.io/component"]
            out[name] = pods[component]
    return out


def _secret_data(objects: Objects, name: str) -> dict[str, bytes]:
    data = objects[("Secret", name)]["data"]
    return {k: base64.b64decode(v) for k, v in data.items()}


def container_env(objects: Objects, container: dict[str, Any], pod: str) -> dict[str, str]:
    """The container's environment as the kubelet builds it."""
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        source = entry.get("valueFrom")
        if source is None:
            env[entry["name"]] = entry.get("value", "")
        elif "fieldRef" in source:
            assert source["fieldRef"]["fieldPath"] == "metadata.name", source
            env[entry["name"]] = pod
        else:
            ref = source["secretKeyRef"]
            env[entry["name"]] = _secret_data(objects, ref["name"])[ref["key"]].decode()
    return env


def expand(word: str, env: dict[str, str]) -> str:
    """`$(VAR)` from the container's env (left as is when VAR is not set, as the kubelet does)."""
    return re.sub(r"\$\(([A-Za-z_]\w*)\)", lambda m: env.get(m[1], m[0]), word)


def _fill(objects: Objects, volume: dict[str, Any], where: Path) -> None:
    """The volume's content in `where` (owned by the pods' fsGroup, as the kubelet does)."""
    where.mkdir(parents=True, exist_ok=True)
    os.chown(where, IMAGE_UID, IMAGE_UID)
    files: dict[str, bytes] = {}
    mode = 0o644
    if "configMap" in volume:
        data = objects[("ConfigMap", volume["configMap"]["name"])]["data"]
        files = {k: v.encode() for k, v in data.items()}
    elif "secret" in volume:
        secret = volume["secret"]
        data = _secret_data(objects, secret["secretName"])
        items = secret.get("items") or [{"key": k, "path": k} for k in data]
        files = {item["path"]: data[item["key"]] for item in items}
        mode = secret.get("defaultMode", mode)
    for path, content in files.items():
        target = where / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        os.chown(target, 0, IMAGE_UID)
        target.chmod(mode)


def interpreter_tree() -> Path | None:
    """The tree of this machine's Python when the image's user cannot enter a top-level
    directory above it (a venv made from a Python under /root, mode 0700), else None. The
    image's Python is its user's to run (and multiprocessing's fork server re-executes it),
    so the pod shows that tree alone there."""
    tree = Path(os.path.realpath(sys.executable)).parents[1]
    top = Path("/", tree.parts[1])
    return None if top.stat().st_mode & 0o001 else tree


def _script(name: str, root: Path, hosts: Path, mounts: list[tuple[Path, str, bool]]) -> str:
    """The shell that makes the pod's root and execs its command as the image's user."""
    r = shlex.quote(str(root))
    tree = interpreter_tree()
    closed = tree.parts[1] if tree else ""
    lines = [
        "set -e",
        f"hostname {shlex.quote(name)}",
        f"mount -t tmpfs -o mode=0755 cl-pod {r}",
        "for d in /*; do n=${d#/}",
        f"  case $n in etc|tmp|{shlex.quote(closed or 'etc')}) continue;; esac",
        f'  if [ -L "$d" ]; then cp -P "$d" {r}/"$n"',
        f'  elif [ -d "$d" ]; then mkdir {r}/"$n"; mount --rbind "$d" {r}/"$n"; fi',
        "done",
    ]
    if tree is not None:
        inside = shlex.quote(f"{root}{tree}")
        lines += [
            f"mkdir {r}/{shlex.quote(closed)}",
            f"mount -t tmpfs -o mode=0755 cl-pod-python {r}/{shlex.quote(closed)}",
            f"mkdir -p {inside} && mount --rbind {shlex.quote(str(tree))} {inside}",
        ]
    lines += [
        f"mkdir {r}/etc && cp -a /etc/. {r}/etc/ && cp {shlex.quote(str(hosts))} {r}/etc/hosts",
        f"mkdir {r}/tmp && mount -t tmpfs -o mode=1777 cl-pod-tmp {r}/tmp",
    ]
    for source, target, read_only in mounts:
        t = shlex.quote(f"{root}{target}")
        lines.append(f"mkdir -p {t} && mount --bind {shlex.quote(str(source))} {t}")
        if read_only:
            lines.append(f"mount -o remount,bind,ro {t}")
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"  # the pod's PATH is the image's
    user = f"--reuid={IMAGE_UID} --regid={IMAGE_UID} --groups={IMAGE_UID}"
    lines.append(f'exec {chroot} {r} setpriv {user} "$@"')
    return "\n".join(lines)


def start_pod(
    objects: Objects, component: str, node: Node, services: dict[str, str], workdir: Path
) -> Pod:
    """The Deployment's pod on `node`, running (see the module docstring)."""
    spec = pod_spec(objects, component)
    (container,) = spec["containers"]
    name = f"grpo-stream-{component}-0"
    base = workdir / name
    hosts = base / "hosts"
    hosts.parent.mkdir(parents=True)
    lines = ["127.0.0.1 localhost", f"{node.addr} {name}"]
    hosts.write_text("\n".join([*lines, *(f"{a} {s}" for s, a in services.items())]) + "\n")
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    held: dict[str, Path] = {}
    mounts: list[tuple[Path, str, bool]] = []
    for mount in container.get("volumeMounts", []):
        where = base / "volumes" / mount["name"]
        if mount["name"] not in held:
            _fill(objects, volumes[mount["name"]], where)
            held[mount["name"]] = where
        mounts.append((where, mount["mountPath"], bool(mount.get("readOnly"))))
    (base / "root").mkdir()
    env = container_env(objects, container, name)
    argv = [expand(w, env) for w in [*container["command"], *container.get("args", [])]]
    image_env = {  # the image: grpo-stream on PATH (here, this venv's), its user's home
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "LANG": "C.UTF-8",
    }
    log = base / "pod.log"
    cmd = ["nsenter", f"--net={node.netns}", "unshare", "--uts", "--mount",
           "--propagation", "private", "sh", "-c",
           _script(name, base / "root", hosts, mounts), "sh", *argv]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                env={**image_env, **env}, start_new_session=True)  # fmt: skip
    return Pod(component, name, node, held, proc, log)
