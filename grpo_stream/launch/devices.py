"""What placement is given: each host's GPUs, the model's size, and the last run's devices.

- Local runs read this machine's GPUs through NVML; cluster runs read each host's `devices`
  from the cluster file (recorded fingerprints, or "auto" for this machine).
- The model's size comes from `model.params`, else from the safetensors headers of a local
  model directory (no weights are read).
- RUN_DIR/placement.json keeps the devices and placement of the last `up`: a resumed run
  keeps its placement while every device's fingerprint is the same, and re-plans (saying
  which device changed) when one differs: another model, other memory (MIG), gone, new.
- A service started with CUDA_VISIBLE_DEVICES reports only those GPUs (`assigned`), so the
  hub scores a generator by its own GPU and `status` shows which ones it holds.
"""

from __future__ import annotations

import dataclasses
import json
import math
import socket
import struct
from pathlib import Path
from typing import Any

import structlog

from grpo_stream.config import RunConfig
from grpo_stream.config.cluster import ClusterFile
from grpo_stream.hardware.cluster import host_devices
from grpo_stream.hardware.device import DeviceFingerprint, HostFingerprint
from grpo_stream.hardware.nvml import NvmlUnavailable, read_nvml
from grpo_stream.hardware.specs import derive_gpu
from grpo_stream.launch.placement import HostDevices, Placement, Slot, place
from grpo_stream.launch.side import check_without_gpus, place_side, reward_model_paths
from grpo_stream.models.loading import resolve_model


def local_host(
    cfg: RunConfig, fingerprint: HostFingerprint, environ: dict[str, str]
) -> HostDevices:
    """This machine as the only host of a local run (NVML's GPUs; none on a CPU host)."""
    gpus = [d for d in fingerprint.devices if d.kind == "gpu"]
    return HostDevices(
        name="local",
        gpus=gpus,
        visible=environ.get("CUDA_VISIBLE_DEVICES"),
        trainer_ranks=cfg.trainer.ranks,
        generators=cfg.generator.count,
        scorers=cfg.scorer.count,
        trainer_gpus=list(cfg.trainer.devices),
        generator_gpus=list(cfg.generator.devices),
    )


def cluster_hosts(cluster: ClusterFile, environ: dict[str, str]) -> list[HostDevices]:
    """Every host of a cluster file with its GPUs (from its `devices`), services and gpus."""
    out = []
    for position, host in enumerate(cluster.hosts):
        devices = host_devices(host, position, live=lambda: local_fingerprint().devices)
        visible = host.env.get("CUDA_VISIBLE_DEVICES")
        if host.launcher == "local" and visible is None:
            visible = environ.get("CUDA_VISIBLE_DEVICES")
        out.append(
            HostDevices(
                name=host.name,
                gpus=[d for d in devices if d.kind == "gpu"],
                visible=visible,
                trainer_ranks=host.count("trainer"),
                generators=host.count("generator"),
                scorers=host.count("scorer"),
                trainer_gpus=list(host.gpus.get("trainer", [])),
                generator_gpus=list(host.gpus.get("generator", [])),
                where=host.name,
            )
        )
    return out


def model_params(cfg: RunConfig) -> int | None:
    """model.params, else the parameter count of a local model's safetensors (None if the
    model is not a local directory)."""
    if cfg.model.params is not None:
        return cfg.model.params

    try:
        folder = Path(resolve_model(cfg.model.name_or_path))
    except FileNotFoundError:
        return None
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    return sum(_count(f) for f in files) if files else None


def _header(path: Path) -> dict[str, Any]:
    """A safetensors header (8-byte length, then JSON of dtypes and shapes), no metadata."""
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header: dict[str, Any] = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return header


def _count(path: Path) -> int:
    """Parameters listed in a safetensors header."""
    return sum(math.prod(v["shape"]) for v in _header(path).values())


DTYPE_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
}
"""Bytes per element of safetensors dtypes (the rest, 8-bit and bool, take 1)."""


def model_bytes(name_or_path: str) -> int | None:
    """The bytes of a local model directory's safetensors tensors, as stored (None when it
    is not a local directory with safetensors, e.g. a hub name)."""
    try:
        folder = Path(resolve_model(name_or_path)).expanduser()
    except FileNotFoundError:
        return None
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        return None
    tensors = [v for f in files for v in _header(f).values()]
    return sum(int(math.prod(v["shape"])) * DTYPE_BYTES.get(v["dtype"], 1) for v in tensors)


def assigned(fingerprint: HostFingerprint, environ: dict[str, str]) -> HostFingerprint:
    """The host fingerprint narrowed to the GPUs CUDA_VISIBLE_DEVICES leaves this process
    (in that order, so the first is cuda:0); unchanged without NVML GPUs or the variable."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if fingerprint.source != "nvml" or visible is None:
        return fingerprint
    by_key = {str(d.index): d for d in fingerprint.devices}
    by_key.update({d.uuid: d for d in fingerprint.devices if d.uuid})
    keep = [by_key[k] for k in (p.strip() for p in visible.split(",")) if k in by_key]
    return dataclasses.replace(fingerprint, devices=keep)


def announce(fingerprint: HostFingerprint, environ: dict[str, str]) -> HostFingerprint:
    """`assigned`, logged as `devices.assigned` with the fingerprint ids (once, at start)."""
    mine = assigned(fingerprint, environ)
    structlog.get_logger().info(
        "devices.assigned",
        cuda_visible_devices=environ.get("CUDA_VISIBLE_DEVICES"),
        devices=[d.device_id for d in mine.devices if d.kind == "gpu"],
        source=mine.source,
    )
    return mine


def _key(d: DeviceFingerprint) -> dict[str, Any]:
    return {"name": d.name, "uuid": d.uuid, "memory_total_bytes": d.memory_total_bytes}


def _slots(data: list[dict[str, Any]]) -> tuple[Slot, ...]:
    return tuple(
        Slot(s["host"], tuple(s["devices"]), tuple(s["device_ids"]), s["ranks"]) for s in data
    )


def placement_inputs(cfg: RunConfig) -> dict[str, Any]:
    """The settings a placement follows from (with the devices): a saved placement made from
    other ones is not reused."""
    return {
        "placement": cfg.run.placement,
        "ranks": cfg.trainer.ranks,
        "trainer_devices": cfg.trainer.devices,
        "generators": cfg.generator.count,
        "generator_devices": cfg.generator.devices,
        "tensor_parallel": cfg.generator.tensor_parallel,
        "params": cfg.model.params,
        "model": cfg.model.name_or_path,
        "scorers": cfg.scorer.count,
        "scorer_workers": cfg.scorer.workers,
        "eval_every": cfg.eval.every,
        "eval_device": cfg.eval.device,
        "reward_models": reward_model_paths(cfg),
    }


def remember(
    run_dir: Path,
    hosts: list[HostDevices],
    fresh: Placement,
    resume: bool,
    inputs: dict[str, Any] | None = None,
) -> tuple[Placement, list[str]]:
    """The placement to use and what changed: on resume with every device and every input
    setting as before, the saved one; otherwise `fresh`, saved for the next run. The notes
    name changed devices."""
    path = run_dir / "placement.json"
    now = {d.device_id: _key(d) for h in hosts for d in h.gpus}
    before: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    seen: dict[str, Any] = before.get("devices", {})
    same_inputs = before.get("inputs") == (inputs or {})
    changed = sorted(
        f"{i}: {seen.get(i, {}).get('name', 'absent')} -> {now.get(i, {}).get('name', 'absent')}"
        for i in set(seen) | set(now)
        if seen.get(i) != now.get(i)
    )
    if resume and before and not changed and same_inputs and before.get("mode") == fresh.mode:
        evaluator = before.get("evaluator")
        saved = Placement(
            fresh.mode,
            _slots(before["trainer"]),
            _slots(before["generators"]),
            tuple((i, why) for i, why in before["idle"]),
            _slots(before.get("scorers", [])),
            None if evaluator is None else _slots([evaluator])[0],
            tuple(before.get("notes", [])),
        )
        return saved, list(saved.notes)
    notes = [f"devices changed since the last run ({'; '.join(changed)}): re-planned"]
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {"devices": now, "inputs": inputs or {}, **dataclasses.asdict(fresh)}
    path.write_text(json.dumps(record, indent=1))
    return fresh, [*(notes if (before and changed) else []), *fresh.notes]


def local_fingerprint(nvml: Any = None) -> HostFingerprint:
    """This machine's GPUs through NVML (`nvml` replaces pynvml in tests); no GPU is a host
    without devices here (placement needs no CPU benchmark)."""
    host = socket.gethostname()
    try:
        raw = read_nvml(nvml)
    except NvmlUnavailable as exc:
        return HostFingerprint(hostname=host, source="cpu", devices=[], nvml_error=exc.error)
    devices = [derive_gpu(d, index=i, host=host) for i, d in enumerate(raw["devices"])]
    return HostFingerprint(hostname=host, source="nvml", devices=devices)


def placement_over(cfg: RunConfig, hosts: list[HostDevices]) -> Placement:
    """`place` over `hosts`, then GPUs for the evaluator and reward-model scorers
    (launch/side.py); on hosts without GPUs, the check that none insists on one."""
    params = model_params(cfg) if any(h.gpus for h in hosts) else None
    fresh = place(cfg, hosts, params)
    if params is None or not fresh.gpus:
        check_without_gpus(cfg, hosts)
        return fresh
    sizes = {path: model_bytes(path) for path in reward_model_paths(cfg)}
    return place_side(cfg, hosts, fresh, params, sizes)


def placement_for_run(
    cfg: RunConfig,
    cluster: ClusterFile | None,
    resume: bool,
    save: bool,
    environ: dict[str, str],
) -> tuple[Placement, list[str]]:
    """The placement of an `up` run (local, or over a cluster file's hosts) and its notes;
    `save` keeps it in RUN_DIR/placement.json (not for a dry run)."""
    if cluster is None:
        hosts = [local_host(cfg, local_fingerprint(), environ)]
    else:
        hosts = cluster_hosts(cluster, environ)
    fresh = placement_over(cfg, hosts)
    if not save:
        return fresh, list(fresh.notes)
    return remember(Path(cfg.run.run_dir), hosts, fresh, resume, placement_inputs(cfg))
