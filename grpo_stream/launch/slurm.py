"""`up --launcher slurm`: the hosts of a run are the nodes of the Slurm job `up` runs in.

deploy/slurm/grpo-stream.sbatch runs `grpo-stream up --launcher slurm` on the job's first
node; `up` then starts every service through the host launcher "slurm" (one `srun --overlap`
step per service, grpo_stream.launch.cluster), places GPUs with grpo_stream.launch.placement
and supervises with grpo_stream.launch.supervisor, as for any cluster file. This module only
turns the allocation into that cluster file:

- the nodes: SLURM_JOB_NODELIST (Slurm's compressed host list, expanded here); each node is
  dialled by its name, the hub and the trainer bind every interface;
- the layout, from the job's environment (the sbatch script's parameters): the hub on the
  first node; the trainer on the first TRAINER_NODES nodes, TRAINER_GPUS ranks on each
  (torchrun multi-node across them); SCORERS scorers on node SCORER_NODE (1-based);
  GENERATORS_PER_NODE generators on every other node, or beside the trainer when no node is
  left; HUB_PORT; GENERATOR_CPUS, the CPUs of each srun step on a node that runs only
  generators (srun reads SRUN_CPUS_PER_TASK);
- the GPUs: with SLURM_GPUS_ON_NODE > 0 the trainer gets GPUs 0..TRAINER_GPUS-1 of its
  nodes and each generator one GPU (from TRAINER_GPUS up beside the trainer), placed as
  run.placement = "manual"; without GPUs nothing is pinned (run.placement = "none").

Invariant: a bad variable raises SlurmError with one line naming it, before any service
starts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from grpo_stream.config.cluster import ClusterFile, ClusterHost

BIND_ALL = "0.0.0.0"
_RANGE = re.compile(r"\[([^\]]*)\]")
Role = Literal["trainer", "generator"]


class SlurmError(ValueError):
    """The job's environment does not describe a run; the message is one line."""


@dataclass(frozen=True)
class SlurmLayout:
    """Where the services of a run go on the job's nodes (the sbatch script's parameters)."""

    nodes: tuple[str, ...]
    """The job's nodes, in SLURM_JOB_NODELIST's order: the first runs the hub."""
    trainer_nodes: int = 1
    """TRAINER_NODES: the first nodes, each running trainer ranks."""
    trainer_gpus: int = 1
    """TRAINER_GPUS: trainer ranks on each trainer node (one GPU each when the job has GPUs)."""
    generators_per_node: int = 8
    """GENERATORS_PER_NODE: on each generator node."""
    scorers: int = 2
    """SCORERS: scorer processes, all on the scorer node."""
    scorer_node: int = 1
    """SCORER_NODE, 1-based: the node that runs the scorers."""
    gpus_per_node: int = 0
    """SLURM_GPUS_ON_NODE: 0 places no GPU."""
    hub_port: int = 5555
    """HUB_PORT: the hub's port on the first node."""
    generator_cpus: int | None = None
    """GENERATOR_CPUS: CPUs of each srun step on a node that runs only generators (None:
    Slurm's default)."""

    def generator_nodes(self) -> list[int]:
        """Indices of the nodes that run generators: those after the trainer's other than
        the scorer node, else the trainer's own."""
        after = [i for i in range(self.trainer_nodes, len(self.nodes)) if i != self.scorer_node - 1]
        return after or list(range(self.trainer_nodes))


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list ("cl-n[1-3],gpu[07,09-10]") as node names, in order."""
    names: list[str] = []
    for item in _split_top(text):
        names += _expand_one(item)
    return names


def _split_top(text: str) -> list[str]:
    """`text` split at the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def _expand_one(item: str) -> list[str]:
    found = _RANGE.search(item)
    if found is None:
        return [item]
    head, tail = item[: found.start()], item[found.end() :]
    out = []
    for part in found.group(1).split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise SlurmError(f"SLURM_JOB_NODELIST: cannot read the range [{found.group(1)}]")
        for n in range(int(low), int(high or low) + 1):
            out += _expand_one(f"{head}{n:0{len(low)}d}{tail}")
    return out


def _number(environ: Mapping[str, str], name: str, default: int, low: int) -> int:
    text = environ.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or int(text) < low:
        raise SlurmError(f"{name}={text}: expected a whole number >= {low}")
    return int(text)


def layout_from_env(environ: Mapping[str, str]) -> SlurmLayout:
    """The layout of the job `environ` belongs to (SlurmError naming the variable)."""
    nodelist = environ.get("SLURM_JOB_NODELIST", "").strip()
    if not nodelist:
        raise SlurmError(
            "up --launcher slurm runs inside a Slurm job (sbatch, salloc): "
            "SLURM_JOB_NODELIST is not set"
        )
    nodes = tuple(expand_hostlist(nodelist))
    cpus = _number(environ, "GENERATOR_CPUS", 0, 1)
    layout = SlurmLayout(
        nodes=nodes,
        trainer_nodes=_number(environ, "TRAINER_NODES", 1, 1),
        trainer_gpus=_number(environ, "TRAINER_GPUS", 1, 1),
        generators_per_node=_number(environ, "GENERATORS_PER_NODE", 8, 1),
        scorers=_number(environ, "SCORERS", 2, 0),
        scorer_node=_number(environ, "SCORER_NODE", 1, 1),
        gpus_per_node=_number(environ, "SLURM_GPUS_ON_NODE", 0, 0),
        hub_port=_number(environ, "HUB_PORT", 5555, 1),
        generator_cpus=cpus or None,
    )
    check(layout)
    return layout


def check(layout: SlurmLayout) -> None:
    """SlurmError when the layout does not fit the job's nodes or GPUs."""
    count = len(layout.nodes)
    if layout.trainer_nodes > count:
        raise SlurmError(f"TRAINER_NODES={layout.trainer_nodes}, but the job has {count} node(s)")
    if layout.scorer_node > count:
        raise SlurmError(f"SCORER_NODE={layout.scorer_node}, but the job has {count} node(s)")
    if layout.hub_port > 65535:
        raise SlurmError(f"HUB_PORT={layout.hub_port}: not a port")
    gpus = layout.gpus_per_node
    if not gpus:
        return
    if layout.trainer_gpus > gpus:
        raise SlurmError(
            f"TRAINER_GPUS={layout.trainer_gpus}, but the job has {gpus} GPU(s) per node "
            "(SLURM_GPUS_ON_NODE)"
        )
    shared = layout.generator_nodes()[0] < layout.trainer_nodes
    need = layout.generators_per_node + (layout.trainer_gpus if shared else 0)
    if need > gpus:
        beside = f" beside TRAINER_GPUS={layout.trainer_gpus}" if shared else ""
        raise SlurmError(
            f"GENERATORS_PER_NODE={layout.generators_per_node} generators of one GPU each"
            f"{beside} need {need} GPUs per node, but the job has {gpus} (SLURM_GPUS_ON_NODE)"
        )


def allocation_cluster(layout: SlurmLayout) -> ClusterFile:
    """The job's nodes as the hosts of a cluster file, every service started by srun."""
    return ClusterFile(
        hub_port=layout.hub_port, hosts=[_host(layout, i) for i in range(len(layout.nodes))]
    )


def _host(layout: SlurmLayout, i: int) -> ClusterHost:
    """Node `i`: its services, its GPUs (on a job with GPUs) and its srun environment."""
    generators = layout.generator_nodes()
    base = layout.trainer_gpus if generators[0] < layout.trainer_nodes else 0
    services: dict[str, int] = {}
    gpus: dict[Role, list[int]] = {}
    if i == 0:
        services["hub"] = 1
    if i < layout.trainer_nodes:
        services["trainer"] = layout.trainer_gpus
        gpus["trainer"] = list(range(layout.trainer_gpus))
    if i == layout.scorer_node - 1 and layout.scorers:
        services["scorer"] = layout.scorers
    if i in generators:
        services["generator"] = layout.generators_per_node
        gpus["generator"] = list(range(base, base + layout.generators_per_node))
    env = {}
    if set(services) == {"generator"} and layout.generator_cpus is not None:
        env["SRUN_CPUS_PER_TASK"] = str(layout.generator_cpus)  # srun's --cpus-per-task
    return ClusterHost(
        name=layout.nodes[i],
        address=layout.nodes[i],
        bind=BIND_ALL if i == 0 else None,  # the hub and the trainer's rank 0
        launcher="slurm",
        services=services,
        gpus=gpus if layout.gpus_per_node else {},
        env=env,
    )


def placement_override(layout: SlurmLayout) -> list[str]:
    """run.placement as the layout places GPUs (`manual`), or `none` on a job without GPUs;
    a `--set run.placement=...` given to `up` comes after, and wins."""
    mode = "manual" if layout.gpus_per_node else "none"
    return [f"run.placement={json.dumps(mode)}"]
