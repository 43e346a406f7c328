"""Placement: which GPUs each service of a run gets, so `up` can start it with them.

Modes (`run.placement`):
    plan       the role plan of the fingerprints (grpo_stream.hardware.plan): the trainer's
               ranks, one per GPU, on the GPUs with most memory; one generator per GPU, or per
               `generator.tensor_parallel` GPUs of one host; the rest idle with a reason.
               With distillation each teacher takes a generator's GPUs while one is left.
    manual     `trainer.devices` / `generator.devices` in the config (local runs), or a host's
               `gpus = { trainer = [...], generator = [...] }` in the cluster file.
    colocated  trainer and generators share the trainer's GPUs; the generator's reservation
               (vLLM `gpu_memory_utilization`) must leave the trainer its memory rule.
    none       CUDA_VISIBLE_DEVICES untouched (CPU hosts); `auto` is plan when any host has
               a GPU, else none.

Invariants: every GPU given to a service exists on its host and is among the
CUDA_VISIBLE_DEVICES that host's services inherit (when set); outside colocated no GPU is
given twice (a GPU shared with the evaluator or a reward-model scorer is budgeted, see
launch/side.py); a trainer node runs one rank per GPU it holds, node 0 holds rank 0; when
GPUs are placed, services that hold none start with CUDA_VISIBLE_DEVICES="" (so reward code
cannot land on GPU 0). A bad placement raises PlacementError with one line naming the
setting, before any service starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from grpo_stream.config import RunConfig
from grpo_stream.hardware.device import DeviceFingerprint
from grpo_stream.hardware.plan import GIB, PlanError, memory_needs, plan_roles
from grpo_stream.hub.dispatch import lease_base

Mode = Literal["plan", "manual", "colocated", "none"]
DEVICE_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
"""CUDA numbers GPUs fastest first unless told otherwise; NVML (and so the plan) by PCI bus."""


class PlacementError(ValueError):
    """No valid placement; the message is one line naming the setting to change."""


@dataclass(frozen=True)
class HostDevices:
    """What placement knows about one host: its GPUs and what the config asks of it."""

    name: str
    gpus: list[DeviceFingerprint]
    visible: str | None = None
    """CUDA_VISIBLE_DEVICES its services inherit (None: unset, every GPU)."""
    trainer_ranks: int = 0
    generators: int = 0
    scorers: int = 0
    trainer_gpus: list[int] = field(default_factory=list)
    generator_gpus: list[int] = field(default_factory=list)
    where: str = "local"
    """How messages name the host's manual settings: "local" (the config) or the host."""


@dataclass(frozen=True)
class Slot:
    """One trainer node or one generator: a host and the GPUs it gets (NVML indices)."""

    host: str
    devices: tuple[int, ...] = ()
    device_ids: tuple[str, ...] = ()
    ranks: int = 1
    """Trainer nodes: ranks on this host (one per GPU when it has GPUs)."""


@dataclass(frozen=True)
class Placement:
    """Where the trainer's nodes and the generators run, with their GPUs."""

    mode: Mode
    trainer: tuple[Slot, ...]
    generators: tuple[Slot, ...]
    idle: tuple[tuple[str, str], ...] = ()
    """(device id, why it is idle)."""
    scorers: tuple[Slot, ...] = ()
    """One per scorer, in instance order (launch/side.py); none placed: no GPU each."""
    evaluator: Slot | None = None
    """The evaluator's (launch/side.py); None: no GPU."""
    notes: tuple[str, ...] = ()
    """What the side services asked for and did not get (they run on the CPU)."""
    teachers: tuple[Slot, ...] = ()
    """Distillation: the GPUs of each teacher that has some (`with_teachers`)."""

    @property
    def gpus(self) -> bool:
        return self.mode != "none"

    def env(self, slot: Slot | None) -> dict[str, str]:
        """The device environment of a service holding `slot` (None: a service without GPUs)."""
        if not self.gpus:
            return {}
        devices = slot.devices if slot is not None else ()
        return {"CUDA_VISIBLE_DEVICES": ",".join(str(d) for d in devices), **DEVICE_ORDER}


def _label(setting: str, host: HostDevices) -> str:
    if host.where == "local":
        return {"trainer": "trainer.devices", "generator": "generator.devices"}[setting]
    return f"hosts.{host.name}.gpus.{setting}"


def usable(host: HostDevices) -> list[int]:
    """NVML indices of the host's GPUs that CUDA_VISIBLE_DEVICES leaves visible."""
    indices = [d.index for d in host.gpus]
    if host.visible is None:
        return indices
    by_uuid = {d.uuid: d.index for d in host.gpus if d.uuid}
    out = []
    for item in (p.strip() for p in host.visible.split(",")):
        if not item:
            continue
        index = by_uuid.get(item) if item.startswith("GPU-") else _int(item)
        if index is None or index not in indices:
            raise PlacementError(
                f"CUDA_VISIBLE_DEVICES={host.visible} on {host.name} names GPU {item}, "
                f"which it does not have ({_have(host)})"
            )
        out.append(index)
    return out


def _int(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def _have(host: HostDevices) -> str:
    n = len(host.gpus)
    return "no GPU" if n == 0 else f"{n} GPU(s): 0-{n - 1}" if n > 1 else "1 GPU: 0"


def resolve_mode(requested: str, hosts: Sequence[HostDevices]) -> Mode:
    if requested == "auto":
        return "plan" if any(h.gpus for h in hosts) else "none"
    modes: dict[str, Mode] = {m: m for m in ("plan", "manual", "colocated", "none")}
    if requested not in modes:
        raise PlacementError(f"run.placement = {requested!r} is not a placement mode")
    if requested != "none" and not any(h.gpus for h in hosts):
        raise PlacementError(
            f"run.placement = {requested!r} needs GPUs, but NVML sees none on "
            f'{", ".join(h.name for h in hosts)}: use run.placement = "none" or "auto"'
        )
    return modes[requested]


def place(cfg: RunConfig, hosts: Sequence[HostDevices], params: int | None) -> Placement:
    """The placement of a run over `hosts` (see the module docstring). `params` is the model's
    parameter count (needed by every mode that places GPUs)."""
    mode = resolve_mode(cfg.run.placement, hosts)
    if mode != "plan" and not any(h.trainer_ranks for h in hosts):
        raise PlacementError("no host runs the trainer: give one services.trainer = RANKS")
    if mode == "none":
        return _cpu(hosts)
    if params is None:
        raise PlacementError("placing GPUs needs the model's size: set model.params")
    if mode == "plan":
        teachers = cfg.teacher.count if cfg.algo.distill.teacher is not None else 0
        return with_teachers(_plan(cfg, hosts, params), teachers)
    if mode == "manual":
        return _manual(cfg, hosts, params)
    return _colocated(cfg, hosts, params)


def with_teachers(placement: Placement, count: int) -> Placement:
    """Distillation under plan: each of `count` teachers takes the GPUs of the plan's last
    generator while at least one generator keeps its own (teacher scoring then runs beside
    generation, not on its devices); the teachers left over run without a GPU."""
    gens = list(placement.generators)
    teachers: list[Slot] = []
    while len(teachers) < count and len(gens) > 1:
        teachers.append(gens.pop())
    return replace(placement, generators=tuple(gens), teachers=tuple(reversed(teachers)))


def _cpu(hosts: Sequence[HostDevices]) -> Placement:
    trainer = tuple(Slot(h.name, ranks=h.trainer_ranks) for h in hosts if h.trainer_ranks)
    gens = tuple(Slot(h.name) for h in hosts for _ in range(h.generators))
    return Placement("none", trainer, gens)


def _ids(host: HostDevices, devices: Sequence[int]) -> tuple[str, ...]:
    by_index = {d.index: d.device_id for d in host.gpus}
    return tuple(by_index[i] for i in devices)


def _slot(host: HostDevices, devices: Sequence[int]) -> Slot:
    devices = tuple(sorted(devices))
    return Slot(host.name, devices, _ids(host, devices), ranks=max(1, len(devices)))


def _plan(cfg: RunConfig, hosts: Sequence[HostDevices], params: int) -> Placement:
    owner: dict[str, HostDevices] = {}
    devices: list[DeviceFingerprint] = []
    for host in hosts:
        keep = set(usable(host))
        for d in host.gpus:
            if d.index in keep:
                owner[d.device_id] = host
                devices.append(d)
    try:
        plan = plan_roles(
            devices,
            params,
            cfg.trainer.ranks,
            settings=cfg.hardware,
            base_credits=lease_base(cfg),
        )
    except PlanError as exc:
        raise PlacementError(f"run.placement = plan: {exc} (trainer.ranks, model.params)") from None
    trainer = tuple(
        _slot(h, [a.index for a in plan.trainer if owner[a.device_id] is h])
        for h in hosts
        if any(owner[a.device_id] is h for a in plan.trainer)
    )
    tp = cfg.generator.tensor_parallel
    gens: list[Slot] = []
    idle = [(a.device_id, a.reason) for a in plan.idle]
    for host in hosts:
        mine = [a for a in plan.generators if owner[a.device_id] is host]
        whole = len(mine) - len(mine) % tp
        gens += [_slot(host, [a.index for a in mine[i : i + tp]]) for i in range(0, whole, tp)]
        idle += [
            (a.device_id, f"generator.tensor_parallel = {tp} needs {tp} GPUs of one host")
            for a in mine[whole:]
        ]
    if not gens:
        raise PlacementError(
            f"run.placement = plan: no {tp} GPU(s) of one host left to generate "
            f"(generator.tensor_parallel = {tp})"
        )
    if plan.colocated:
        _check_colocated(cfg, hosts, trainer, gens, params)
    mode: Mode = "colocated" if plan.colocated else "plan"
    return Placement(mode, trainer, tuple(gens), tuple(idle))


def _check_indices(host: HostDevices, setting: str, devices: Sequence[int]) -> None:
    visible = usable(host)
    for index in devices:
        if index not in {d.index for d in host.gpus}:
            raise PlacementError(
                f"{_label(setting, host)} names GPU {index}, but {host.name} has {_have(host)}"
            )
        if index not in visible:
            raise PlacementError(
                f"CUDA_VISIBLE_DEVICES={host.visible} on {host.name} hides GPU {index}, "
                f"which {_label(setting, host)} names: unset it or change the devices"
            )


def _check_fits(cfg: RunConfig, host: HostDevices, devices: Sequence[int], params: int) -> None:
    need, _ = memory_needs(params, cfg.trainer.ranks, cfg.hardware)
    for d in host.gpus:
        if d.index in devices and (d.memory_total_bytes or 0) < need:
            raise PlacementError(
                f"{_label('trainer', host)}: GPU {d.index} ({d.name}, "
                f"{(d.memory_total_bytes or 0) / GIB:.1f} GiB) cannot hold the trainer: "
                f"{params:,} params x {cfg.hardware.trainer_bytes_per_param:g} B x "
                f"{1 + cfg.hardware.trainer_headroom:g} = {need / GIB:.1f} GiB per rank"
            )


def _manual(cfg: RunConfig, hosts: Sequence[HostDevices], params: int) -> Placement:
    tp = cfg.generator.tensor_parallel
    trainer: list[Slot] = []
    gens: list[Slot] = []
    for host in hosts:
        t, g = host.trainer_gpus, host.generator_gpus
        _check_indices(host, "trainer", t)
        _check_indices(host, "generator", g)
        if len(t) != host.trainer_ranks:
            raise PlacementError(
                f"{_label('trainer', host)} = {t} gives {len(t)} GPU(s) for "
                f"{host.trainer_ranks} trainer rank(s) on {host.name}: one GPU per rank"
            )
        if len(g) != host.generators * tp:
            raise PlacementError(
                f"{_label('generator', host)} = {g} gives {len(g)} GPU(s) for {host.generators} "
                f"generator(s) x generator.tensor_parallel = {tp} on {host.name}"
            )
        shared = sorted(set(t) & set(g))
        if shared or len(set(t)) != len(t) or len(set(g)) != len(g):
            raise PlacementError(
                f"{host.name}: a GPU is given twice in {_label('trainer', host)} / "
                f'{_label("generator", host)}: use run.placement = "colocated" to share'
            )
        _check_fits(cfg, host, t, params)
        if t:
            trainer.append(_slot(host, t))
        gens += [_slot(host, g[i : i + tp]) for i in range(0, len(g), tp)]
    return Placement("manual", tuple(trainer), tuple(gens), _unused(hosts, trainer, gens))


def _unused(
    hosts: Sequence[HostDevices], trainer: Sequence[Slot], gens: Sequence[Slot]
) -> tuple[tuple[str, str], ...]:
    taken = {i for s in (*trainer, *gens) for i in s.device_ids}
    return tuple(
        (d.device_id, "not named by any service")
        for h in hosts
        for d in h.gpus
        if d.device_id not in taken
    )


def _colocated(cfg: RunConfig, hosts: Sequence[HostDevices], params: int) -> Placement:
    """Trainer ranks on trainer.devices (default: the first visible GPUs), each host's
    generators on the same GPUs, tensor_parallel consecutive ones each, round robin."""
    tp = cfg.generator.tensor_parallel
    trainer: list[Slot] = []
    gens: list[Slot] = []
    for host in hosts:
        if not host.trainer_ranks:
            continue
        t = host.trainer_gpus or usable(host)[: host.trainer_ranks]
        _check_indices(host, "trainer", t)
        if len(t) != host.trainer_ranks or len(t) < tp:
            raise PlacementError(
                f"run.placement = colocated: {host.name} needs {max(host.trainer_ranks, tp)} "
                f"visible GPU(s) for trainer.ranks = {host.trainer_ranks} and "
                f"generator.tensor_parallel = {tp}, has {len(t)}"
            )
        _check_fits(cfg, host, t, params)
        trainer.append(_slot(host, t))
        groups = [t[i : i + tp] for i in range(0, len(t) - len(t) % tp, tp)]
        gens += [_slot(host, groups[n % len(groups)]) for n in range(host.generators)]
    if not trainer:
        raise PlacementError("run.placement = colocated: no host runs the trainer")
    _check_colocated(cfg, hosts, tuple(trainer), gens, params)
    return Placement("colocated", tuple(trainer), tuple(gens), _unused(hosts, trainer, gens))


def _check_colocated(
    cfg: RunConfig,
    hosts: Sequence[HostDevices],
    trainer: Sequence[Slot],
    gens: Sequence[Slot],
    params: int,
) -> None:
    """A shared GPU holds the trainer's memory rule plus the generator's reservation (vLLM
    reserves gpu_memory_utilization of the whole GPU; hf needs the generator's rule)."""
    need_t, need_g = memory_needs(params, cfg.trainer.ranks, cfg.hardware)
    util = cfg.generator.gpu_memory_utilization
    by_host = {h.name: {d.index: d for d in h.gpus} for h in hosts}
    shared = {(s.host, i) for s in trainer for i in s.devices}
    for slot in gens:
        for index in slot.devices:
            if (slot.host, index) not in shared:
                continue
            d = by_host[slot.host][index]
            total = d.memory_total_bytes or 0
            gen = util * total if cfg.generator.engine == "vllm" else need_g
            if need_t + gen > total:
                room = max(0.0, (total - need_t) / total) if total else 0.0
                raise PlacementError(
                    f"colocated on {d.device_id} ({d.name}, {total / GIB:.1f} GiB): the trainer "
                    f"needs {need_t / GIB:.1f} GiB and the generator {gen / GIB:.1f} GiB; "
                    f"lower generator.gpu_memory_utilization to <= {room:.2f} or model.params"
                )
