"""One poll of a run: its files' new lines, the hub's status, and where the run stands.

Where it stands (`phase`): live (the hub answers); the run's recorded end once `up` wrote
outcome.json (completed, interrupted, failed); unreachable (the run directory is held but the
hub does not answer: starting, restarting or hung); dead (nobody holds the run directory and
no end was recorded: killed); waiting (no hub address yet).

`poll` does the blocking work (file reads, the status request) and may run on a worker
thread, one call at a time; `apply` folds a poll into the kept state and returns the update
for the pages, `snapshot` the whole state; both run where updates are sent out.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grpo_stream.config import ConfigError, RunConfig, load_config
from grpo_stream.config.transport import SecuritySettings
from grpo_stream.dashboard import graph
from grpo_stream.dashboard.rundir import Collected, RunFiles
from grpo_stream.hub.auth import AuthError, status_credential
from grpo_stream.rundir.final import final_counters
from grpo_stream.rundir.lock import is_held
from grpo_stream.rundir.outcome import read_outcome
from grpo_stream.session.status import HubStatus, StatusClient, StatusUnavailable

STATUS_TIMEOUT_S = 2.0
"""How long one poll waits for the hub's status."""


@dataclass
class Polled:
    """One poll's findings."""

    collected: Collected | None
    status: HubStatus | None
    phase: str
    reason: str = ""
    problems: list[str] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)  # a run that is over: its last


@dataclass(frozen=True)
class RunInfo:
    """What the page's header says of the run, from its resolved config."""

    name: str
    run_dir: str
    max_steps: int | None = None
    model: str = ""
    task: str = ""
    groups_per_step: int | None = None
    group_size: int | None = None
    max_staleness: int | None = None


class RunSource:
    """A run directory (and its hub), or a hub alone (`run_dir` None)."""

    def __init__(
        self,
        run_dir: Path | None,
        hub: str | None = None,
        security: SecuritySettings | None = None,
    ) -> None:
        if run_dir is None and hub is None:
            raise ValueError("a run directory or a hub address is needed")
        self.run_dir = run_dir
        self.hub = hub
        cfg, self.config_problem = _run_config(run_dir)
        self.security = security or (cfg.security if cfg is not None else SecuritySettings())
        self.info = _info(run_dir, hub, cfg)
        self.files = RunFiles(run_dir) if run_dir is not None else None
        self.graph = graph.GraphBuilder()
        self._client: StatusClient | None = None
        self._clients = 0  # clients made so far (each needs its own identity)
        self.last: dict[str, Any] = {"phase": "waiting", "reason": "", "problems": []}
        self.last_graph: dict[str, Any] = {"nodes": [], "queues": {}}

    # ----- the blocking half ------------------------------------------------------------
    def poll(self) -> Polled:
        collected = self.files.collect() if self.files is not None else None
        problems = [self.config_problem] if self.config_problem else []
        outcome = read_outcome(self.run_dir) if self.run_dir is not None else None
        if outcome is not None:
            self.close()
            counters = final_counters(self.run_dir) if self.run_dir is not None else {}
            return Polled(collected, None, outcome.ended, outcome.reason, problems, counters)
        address = self._address()
        if address is None:
            return Polled(collected, None, "waiting", "no hub address yet (hub.addr)", problems)
        try:
            status = self._status_client(address).ask(STATUS_TIMEOUT_S)
        except StatusUnavailable as exc:
            # the connection stays: ZeroMQ reconnects to a hub that comes back, and a late
            # answer is read by the next poll instead of being sent to a closed socket
            if self.run_dir is not None and not is_held(self.run_dir):
                why = "no process holds the run directory and no end was recorded (killed?)"
                counters = final_counters(self.run_dir)
                return Polled(collected, None, "dead", why, problems, counters)
            return Polled(collected, None, "unreachable", str(exc), [*problems, str(exc)])
        return Polled(collected, status, "live", "", problems)

    def close(self) -> None:
        """Close the hub connection (the next poll opens a new one)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def _address(self) -> str | None:
        if self.hub is not None:
            return self.hub
        if self.run_dir is None:
            return None
        try:
            return (self.run_dir / "hub.addr").read_text().strip() or None
        except OSError:
            return None

    def _status_client(self, address: str) -> StatusClient:
        if self._client is not None and self._client.address != address:
            self.close()
        if self._client is None:
            self._clients += 1
            identity = f"dashboard-{os.getpid()}-{self._clients}"
            self._client = StatusClient(address, self.security, identity, self._status_key())
        return self._client

    def _status_key(self) -> bytes | None:
        """The run's status key (RUN_DIR/status.token or its secret), for a hub with a
        secret; None without a run directory or before `up` wrote one."""
        try:
            return status_credential(run_dir=self.run_dir)
        except AuthError:
            return None

    # ----- the state half ---------------------------------------------------------------
    def apply(self, polled: Polled) -> dict[str, Any]:
        """Fold a poll into the kept state; the update for the pages."""
        files = self.files.apply(polled.collected) if self.files and polled.collected else None
        metrics = self.files.metrics if self.files is not None else []
        if polled.status is not None:
            self.last_graph = self.graph.live(polled.status, metrics)
        elif polled.phase not in ("unreachable", "waiting") and self.files is not None:
            self.last_graph = graph.finished(self.files.logged, metrics, polled.counters)
        self.last = {
            "phase": polled.phase,
            "reason": polled.reason,
            "problems": polled.problems,
            "hub": polled.status.hub if polled.status else self.hub,
            "policy_version": polled.status.policy_version if polled.status else None,
            "counters": polled.status.counters if polled.status else {},
            "at": time.time(),
        }
        return {
            "run": self.last,
            "graph": self.last_graph,
            "files": files.as_json() if files is not None else None,
        }

    def snapshot(self) -> dict[str, Any]:
        return {
            "info": asdict(self.info),
            "run": self.last,
            "graph": self.last_graph,
            "files": self.files.snapshot() if self.files is not None else None,
        }


def _run_config(run_dir: Path | None) -> tuple[RunConfig | None, str]:
    """The run's resolved config (RUN_DIR/config.toml), or None and why not."""
    if run_dir is None:
        return None, ""
    path = run_dir / "config.toml"
    if not path.exists():
        return None, ""
    try:
        return load_config(path), ""
    except ConfigError as exc:
        return None, f"{path}: {exc}"


def _info(run_dir: Path | None, hub: str | None, cfg: RunConfig | None) -> RunInfo:
    name = run_dir.resolve().name if run_dir is not None else str(hub)
    where = str(run_dir) if run_dir is not None else ""
    if cfg is None:
        return RunInfo(name, where)
    return RunInfo(
        name=name,
        run_dir=where,
        max_steps=cfg.run.max_steps,
        model=cfg.model.name_or_path,
        task=cfg.task.name,
        groups_per_step=cfg.hub.groups_per_step,
        group_size=cfg.generator.group_size,
        max_staleness=cfg.hub.max_staleness,
    )
