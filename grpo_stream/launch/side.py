"""GPUs for the services beside the trainer and the generators: the evaluator, and scorers
that run a reward model.

Who asks (from the settings):
    evaluator  eval.every > 0, for its hf engine unless eval.device = "cpu", and for every
               reward_model of the evaluation task's rewards whose params.device is not
               "cpu" (the evaluator scores in its own process).
    scorer     a reward_model of task.rewards whose params.device is not "cpu" (each of the
               scorer's `scorer.workers` reward workers loads it).
    An unset device or "auto" asks for a GPU where one has room, else runs on the CPU (a
    note says so); "cuda" insists (a PlacementError naming the setting when none has room).
    "cuda:N" is refused under GPU placement: the service sees the GPU it is given as cuda:0.

Memory budgeted (bytes), per instance:
    evaluator  its policy as an hf generator holds it (params x generator_bytes_per_param x
               (1 + generator_headroom)) + its reward models + one process_overhead_gib;
    scorer     scorer.workers x (its reward models + process_overhead_gib);
    a reward model counts its safetensors bytes x (1 + generator_headroom) (read from the
    headers of a local model directory; unknown for a hub name, so only "auto" may meet it,
    and then it runs on the CPU).

Where: each such service takes, on its own host, the visible GPU with the most memory left
after what is already placed there (trainer ranks: their memory rule; a vLLM generator:
gpu_memory_utilization of the GPU; an hf generator: its rule; side services placed before
it), so an idle GPU is taken first and a shared one only within its budget (the service
then shares the GPU, colocated). The evaluator first, then the scorers in instance order.

Invariants: no GPU is given beyond its memory budget; a service that asks for no GPU, or
found none, starts with CUDA_VISIBLE_DEVICES="" (under GPU placement).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from grpo_stream.config import RunConfig
from grpo_stream.config.tasks import RewardSpec
from grpo_stream.envs.registry import generator_rewards
from grpo_stream.hardware.plan import GIB, memory_needs
from grpo_stream.launch.placement import HostDevices, Placement, PlacementError, Slot, usable
from grpo_stream.rewards.sizing import model_copies


@dataclass(frozen=True)
class SideNeed:
    """What one instance of a side service asks of a GPU."""

    setting: str
    """The setting that asks (the one that insists, if any), for messages."""
    required: bool
    """A setting says "cuda": no GPU with room is an error, not the CPU."""
    nbytes: int | None
    """GPU memory budgeted per instance; None: a reward model's size is unknown."""


def _device_asks(setting: str, value: str | None, mode: str) -> bool | None:
    """None: no GPU; False: a GPU where one has room; True: a GPU or an error."""
    value = "auto" if value is None else value
    if value == "cpu":
        return None
    if value.startswith("cuda:"):
        raise PlacementError(
            f'{setting} = "{value}" names a GPU, but under run.placement = "{mode}" the service '
            f'is given its GPU and sees it as cuda:0: set {setting} = "cuda" (or run.placement '
            '= "none" to keep CUDA_VISIBLE_DEVICES as it is)'
        )
    if value not in ("auto", "cuda"):
        raise PlacementError(f'{setting} = "{value}": use "auto", "cuda" or "cpu"')
    return value == "cuda"


def _reward_models(
    rewards: Sequence[RewardSpec] | None, where: str, mode: str
) -> list[tuple[str, str, bool]]:
    """(path, setting, required) of each reward model of `rewards` that asks for a GPU."""
    out = []
    for i, spec in enumerate(rewards or []):
        if spec.name != "reward_model" or spec.path is None:
            continue
        setting = f"{where}.rewards[{i}].params.device"
        device = spec.params.get("device")
        asks = _device_asks(setting, None if device is None else str(device), mode)
        if asks is not None:
            out.append((spec.path, setting, asks))
    return out


def _need(parts: list[tuple[str, bool, int | None]], copies: int, overhead: int) -> SideNeed | None:
    """The need of an instance made of `parts` (setting, required, bytes), `copies` times
    (one per process), or None when no part asks for a GPU."""
    if not parts:
        return None
    required = [setting for setting, req, _ in parts if req]
    sizes = [n for _, _, n in parts]
    nbytes = None if None in sizes else copies * (sum(n or 0 for n in sizes) + overhead)
    return SideNeed(required[0] if required else parts[0][0], bool(required), nbytes)


def side_needs(
    cfg: RunConfig, mode: str, params: int, reward_bytes: Mapping[str, int | None]
) -> dict[str, SideNeed | None]:
    """{"evaluator": ..., "scorer": ...}: what each instance asks (None: no GPU).
    `reward_bytes`: the safetensors bytes of each reward model path (None: unknown)."""
    hw = cfg.hardware
    overhead = int(hw.process_overhead_gib * GIB)

    def rewards(items: list[tuple[str, str, bool]]) -> list[tuple[str, bool, int | None]]:
        return [
            (setting, req, _scaled(reward_bytes.get(path), 1 + hw.generator_headroom))
            for path, setting, req in items
        ]

    scorer = rewards(_reward_models(cfg.task.rewards, "task", mode))
    evaluator: list[tuple[str, bool, int | None]] = []
    if cfg.eval.every > 0:
        engine = _device_asks("eval.device", cfg.eval.device, mode)
        if engine is not None:
            evaluator.append(("eval.device", engine, memory_needs(params, 1, hw)[1]))
        evaluator += rewards(_reward_models(*_eval_rewards(cfg), mode))
    return {
        "evaluator": _need(evaluator, 1, overhead),
        "scorer": _need(scorer, model_copies(cfg.scorer.workers), overhead),
    }


def _eval_rewards(cfg: RunConfig) -> tuple[Sequence[RewardSpec] | None, str]:
    """The evaluation task's rewards and where they are set."""
    if cfg.eval.task is None:
        return cfg.task.rewards, "task"
    return cfg.eval.task.rewards, "eval.task"


def reward_model_paths(cfg: RunConfig) -> list[str]:
    """Paths of the reward models a scorer or the evaluator of this run loads."""
    specs = [*(cfg.task.rewards or [])]
    if cfg.eval.every > 0:
        specs += _eval_rewards(cfg)[0] or []
    return sorted({s.path for s in specs if s.name == "reward_model" and s.path is not None})


def check_without_gpus(cfg: RunConfig, hosts: Sequence[HostDevices]) -> None:
    """No host has a GPU (run.placement = "none" there): a side service whose setting says
    "cuda" could not start; a PlacementError naming it, before anything starts."""
    if any(h.gpus for h in hosts):
        return
    asks = [("eval.device", cfg.eval.device)] if cfg.eval.every > 0 else []
    rewards, where = _eval_rewards(cfg)
    for specs, prefix in ((cfg.task.rewards, "task"), (rewards if asks else None, where)):
        for i, spec in enumerate(specs or []):
            if spec.name == "reward_model":
                device = spec.params.get("device")
                asks.append((f"{prefix}.rewards[{i}].params.device", str(device)))
    for setting, value in asks:
        if str(value).startswith("cuda"):
            names = ", ".join(h.name for h in hosts)
            raise PlacementError(
                f'{setting} = "{value}" but NVML sees no GPU on {names}: set it to "auto" or "cpu"'
            )


def _scaled(nbytes: int | None, factor: float) -> int | None:
    return None if nbytes is None else int(nbytes * factor)


def memory_left(
    cfg: RunConfig, hosts: Sequence[HostDevices], placement: Placement, params: int
) -> dict[tuple[str, int], int]:
    """(host, NVML index) -> bytes of each visible GPU not budgeted to the trainer or the
    generators of `placement`."""
    need_t, need_g = memory_needs(params, cfg.trainer.ranks, cfg.hardware)
    totals: dict[tuple[str, int], int] = {}
    for host in hosts:
        visible = set(usable(host))
        for d in host.gpus:
            if d.index in visible:
                totals[(host.name, d.index)] = d.memory_total_bytes or 0
    left = dict(totals)
    for slot in placement.trainer:
        for index in slot.devices:
            left[(slot.host, index)] -= need_t
    util = cfg.generator.gpu_memory_utilization
    for slot in placement.generators:
        for index in slot.devices:
            key = (slot.host, index)
            left[key] -= int(util * totals[key]) if cfg.generator.engine == "vllm" else need_g
    return {key: max(0, value) for key, value in left.items()}


def _take(
    host: HostDevices,
    service: str,
    need: SideNeed | None,
    left: dict[tuple[str, int], int],
    notes: list[str],
) -> Slot:
    """A slot on `host`: the GPU with the most memory left when `need` fits it, else none."""
    if need is None:
        return Slot(host.name)
    mine = [(value, index) for (name, index), value in left.items() if name == host.name]
    best = max(mine, key=lambda c: (c[0], -c[1]), default=None)  # most left, lowest index
    if need.nbytes is not None and best is not None and best[0] >= need.nbytes:
        left[(host.name, best[1])] -= need.nbytes
        ids = tuple(d.device_id for d in host.gpus if d.index == best[1])
        return Slot(host.name, (best[1],), ids)
    if need.nbytes is None:
        why = "a reward model's size is unknown (give a local model directory)"
    else:
        room = f"{best[0] / GIB:.1f} GiB left on GPU {best[1]}" if best else "no visible GPU"
        why = f"it needs {need.nbytes / GIB:.1f} GiB and {host.name} has {room}"
    if need.required:
        raise PlacementError(
            f'{need.setting} = "cuda": no GPU for the {service}: {why}; set it to "auto" or '
            '"cpu", or lower generator.gpu_memory_utilization'
        )
    notes.append(f"{service} on {host.name} runs on the CPU: {why}")
    return Slot(host.name)


def place_side(
    cfg: RunConfig,
    hosts: Sequence[HostDevices],
    placement: Placement,
    params: int,
    reward_bytes: Mapping[str, int | None],
) -> Placement:
    """`placement` with a slot for the evaluator and for each scorer (see the module
    docstring); GPUs they take are no longer idle."""
    needs = side_needs(cfg, placement.mode, params, reward_bytes)
    left = memory_left(cfg, hosts, placement, params)
    notes: list[str] = []
    evaluator = None
    if cfg.eval.every > 0 and hosts:
        evaluator = _take(hosts[0], "evaluator", needs["evaluator"], left, notes)
    scorers = tuple(
        _take(host, "scorer", needs["scorer"], left, notes)
        for host in hosts
        for _ in range(0 if generator_rewards(cfg.env) else host.scorers)
    )
    taken = {i for s in (*scorers, evaluator) if s is not None for i in s.device_ids}
    idle = tuple((i, why) for i, why in placement.idle if i not in taken)
    return dataclasses.replace(
        placement, scorers=scorers, evaluator=evaluator, idle=idle, notes=tuple(notes)
    )
