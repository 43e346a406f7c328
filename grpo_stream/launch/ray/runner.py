"""`up --launcher ray`: the services of a run as Ray actors, watched like local processes.

`RayRunner` is the Runner `Up` drives (grpo_stream.launch.supervisor): `start` makes one
actor per service (grpo_stream.launch.ray.actor) on the node its host names, with the GPUs
placement gave it reserved (num_gpus; the trainer's nodes in one placement group, so they are
reserved together or not at all), and with what the service needs from this machine shipped
as the actor's arguments (grpo_stream.launch.shipping); a thread per actor turns its output
lines into log events, so `up` merges them on the console as it does for local processes.

Restarts: Ray's, not `up`'s. An actor may restart `run.restarts` times (max_restarts); each
restart starts the service again and is shown on the console. `up` hears of an exit only
when the service ended with 0, or when Ray gave up on it (then `up` fails as it does for a
local service that used up its restarts). Stopping kills the actor after the service has
stopped; `close` removes the placement group and, for a Ray cluster `up` started itself,
shuts it down: Ctrl-C leaves nothing running.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from grpo_stream.config import RunConfig
from grpo_stream.launch.placement import Placement
from grpo_stream.launch.ray.actor import PYTHON, ServiceProcess
from grpo_stream.launch.ray.cluster import RayClusterError, RayNode, on_node
from grpo_stream.launch.shipping import shipment
from grpo_stream.launch.supervisor import Launched, ServiceSpec, drain_events, parse_line
from grpo_stream.rundir.lock import OWNER_ENV

GROUP_TIMEOUT_S = 120.0
"""How long the trainer's placement group may wait for its resources."""
RETRY_S = 0.5  # between calls to an actor that Ray is restarting
PLACE_TIMEOUT_S = 300.0
"""How long a service's actor may take to start (placed, restarted) before `up` gives up."""


class RayServiceProcess(ServiceProcess):
    """ServiceProcess as a Ray actor: knows whether Ray restarted it."""

    def __init__(
        self,
        service: str,
        argv: list[str],
        env: dict[str, str],
        private_dir: str,
        files: dict[str, bytes],
    ) -> None:
        restarted = ray.get_runtime_context().was_current_actor_reconstructed
        super().__init__(service, argv, env, private_dir, files, restarted)


@dataclass
class RayProc:
    """One service's actor as `up` watches it."""

    spec: ServiceSpec
    actor: Any
    restarts: int
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=20))
    stopping: bool = False
    pid: int | None = None


class RayRunner:
    """Starts, watches and stops a run's services as Ray actors (see the module docstring)."""

    def __init__(
        self, cfg: RunConfig, nodes: list[RayNode], placement: Placement, started_ray: bool
    ) -> None:
        self.cfg = cfg
        self.nodes = {n.name: n for n in nodes}
        self.placement = placement
        self.started_ray = started_ray
        self.procs: dict[str, RayProc] = {}
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._exits: queue.Queue[tuple[RayProc, int]] = queue.Queue()
        self._serves = cfg.weights.relay or cfg.hub.payloads == "direct"
        self._actor: Any = ray.remote(RayServiceProcess)
        self._group: PlacementGroup | None = None

    # ----- starting --------------------------------------------------------------------
    def _trainer_group(self) -> PlacementGroup:
        """One bundle per trainer node, pinned to its node (Ray's `node:ADDRESS` resource),
        holding its GPUs: all of them reserved, or none."""
        if self._group is None:
            bundles = []
            for slot in self.placement.trainer:
                bundle = {f"node:{self.nodes[slot.host].address}": 0.001}
                if slot.devices:
                    bundle["GPU"] = float(len(slot.devices))
                bundles.append(bundle)
            group = placement_group(bundles, strategy="PACK")
            try:
                ray.get(group.ready(), timeout=GROUP_TIMEOUT_S)
            except GetTimeoutError:
                remove_placement_group(group)
                raise RayClusterError(
                    f"Ray could not reserve the trainer's nodes and GPUs {bundles} in "
                    f"{GROUP_TIMEOUT_S:.0f}s (trainer.ranks, run.placement)"
                ) from None
            self._group = group
        return self._group

    def _scheduling(self, spec: ServiceSpec) -> dict[str, Any]:
        gpus = [d for d in spec.env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
        options: dict[str, Any] = {"num_cpus": 0, "num_gpus": 0}
        if spec.service == "trainer":
            index = next(i for i, s in enumerate(self.placement.trainer) if s.host == spec.host)
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                self._trainer_group(), placement_group_bundle_index=index
            )
            options["num_gpus"] = float(len(gpus))
        else:
            options["scheduling_strategy"] = on_node(self.nodes[spec.host])
            options["num_gpus"] = float(len(gpus))
        return options

    def start(self, spec: ServiceSpec) -> RayProc:
        ship = shipment(spec, Path(self.cfg.run.run_dir), self._serves)
        argv = [PYTHON if a == sys.executable else a for a in ship.argv]
        env = dict(spec.env)
        if OWNER_ENV in os.environ:  # a hub on this host runs under `up`'s run-directory lock
            env[OWNER_ENV] = os.environ[OWNER_ENV]
        actor = self._actor.options(
            max_restarts=spec.restarts_left,
            max_task_retries=0,
            max_concurrency=4,  # `stop` and `info` while `lines` streams
            name=None,
            **self._scheduling(spec),
        ).remote(spec.service, argv, env, ship.directory, ship.files)
        # Ray restarts it; `up` only hears of it when Ray gave up
        proc = RayProc(replace(spec, restarts_left=0), actor, spec.restarts_left)
        self.procs[spec.instance] = proc
        threading.Thread(target=self._follow, args=(proc,), daemon=True).start()
        return proc

    # ----- watching --------------------------------------------------------------------
    def _follow(self, proc: RayProc) -> None:
        """Stream the actor's lines into events until the service ends for good."""
        code, restarts = 1, 0
        proc.pid = self._alive(proc)
        while proc.pid is not None:
            try:
                for ref in proc.actor.lines.remote():
                    item = ray.get(ref)
                    if isinstance(item, int):
                        code = item
                        continue
                    for line in item:
                        self.events.put(parse_line(proc.spec, proc.tail, line))
                self._exits.put((proc, code))
                return
            except RayActorError:
                pid = None if proc.stopping else self._alive(proc)
                if pid is not None and pid != proc.pid:  # Ray started actor and service again
                    restarts += 1
                    self._note(proc, f"restarted by Ray ({restarts} of {proc.restarts})")
                proc.pid = pid
        self._exits.put((proc, code if code != 0 else 1))

    def _alive(self, proc: RayProc) -> int | None:
        """The service's pid once its actor answers; None when Ray gave up on it (or could
        not place it within PLACE_TIMEOUT_S)."""
        deadline = time.monotonic() + PLACE_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                info = ray.get(proc.actor.info.remote(), timeout=10)
            except ActorDiedError:
                return None
            except (RayActorError, GetTimeoutError):
                time.sleep(RETRY_S)  # restarting, or still being placed
                continue
            return int(info["pid"])
        self._note(proc, f"not running after {PLACE_TIMEOUT_S:.0f}s: Ray could not place it")
        return None

    def _note(self, proc: RayProc, what: str) -> None:
        self.events.put(
            {
                "event": "service.restarted",
                "level": "warning",
                "why": what,
                "service": proc.spec.service,
                "instance": proc.spec.instance,
                "host": proc.spec.host,
            }
        )

    def drain(self, timeout_s: float) -> list[dict[str, Any]]:
        return drain_events(self.events, timeout_s)

    def exited(self) -> list[tuple[Launched, int]]:
        done: list[tuple[Launched, int]] = []
        while True:
            try:
                proc, code = self._exits.get_nowait()
            except queue.Empty:
                return done
            if self.procs.get(proc.spec.instance) is proc:
                del self.procs[proc.spec.instance]
                done.append((proc, code))

    # ----- stopping --------------------------------------------------------------------
    def _stop(self, proc: RayProc, grace_s: float) -> int | None:
        proc.stopping = True
        try:
            code: int | None = ray.get(proc.actor.stop.remote(grace_s), timeout=grace_s + 30)
        except (RayActorError, GetTimeoutError):
            code = None
        ray.kill(proc.actor, no_restart=True)
        return code

    def stop(self, instance: str, grace_s: float = 30.0) -> int | None:
        proc = self.procs.pop(instance, None)
        return None if proc is None else self._stop(proc, grace_s)

    def stop_all(self, grace_s: float = 15.0) -> None:
        procs = list(self.procs.values())
        self.procs.clear()
        for proc in procs:
            proc.stopping = True
        refs = [(p, p.actor.stop.remote(grace_s)) for p in procs]
        for _, ref in refs:
            try:
                ray.get(ref, timeout=grace_s + 30)
            except (RayActorError, GetTimeoutError):
                continue
        for proc in procs:
            ray.kill(proc.actor, no_restart=True)

    def close(self) -> None:
        """Remove the trainer's placement group; shut down a Ray that `up` started."""
        if self._group is not None:
            remove_placement_group(self._group)
            self._group = None
        if self.started_ray:
            ray.shutdown()
