"""The `up` run: hub first, then trainer, generators and scorers; merged logs; clean stop.

Ending:
- the trainer exits 0 after max_steps (final checkpoint written): the others are stopped;
- Ctrl-C / SIGTERM: the trainer is stopped first (it writes a final checkpoint), then the rest;
- a service that crashes (non-zero exit) or exits 0 without having been asked to (no end of
  the run follows within `CLEAN_EXIT_GRACE_S`) is restarted while `run.restarts` lasts;
- the hub exits with `EXIT_ABORTED` (the run cannot progress: say a reward always fails):
  `up` says why and fails at once, without restarts;
- otherwise a service that exits unexpectedly: `up` says which, where and why, stops the
  rest, fails.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from grpo_stream.config import RunConfig
from grpo_stream.envs.registry import generator_rewards
from grpo_stream.exits import EXIT_ABORTED
from grpo_stream.launch.console import RunConsole
from grpo_stream.launch.dashboard import DashboardProcess
from grpo_stream.launch.supervisor import Launched, Runner, ServiceSpec, Supervisor
from grpo_stream.rundir.outcome import Ended, write_outcome

CLEAN_EXIT_GRACE_S = 20.0  # a clean exit not followed by the trainer's end in this long: restart


class LaunchError(RuntimeError):
    """A service failed to start or died; the message says which and why."""


@dataclass
class UpResult:
    completed: bool
    steps: int
    run_dir: Path


def service_argv(service: str, instance: str, hub: str | None, extra: list[str]) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "grpo_stream.cli.main",
        "run",
        service,
        "--instance",
        instance,
        "--log-json",
    ]
    if hub is not None:
        argv += ["--hub", hub]
    return argv + extra


def trainer_argv(cfg: RunConfig, hub: str, extra: list[str]) -> list[str]:
    """One trainer process, or `ranks` of them under torchrun (gloo on CPU, NCCL on GPUs)."""
    argv = service_argv("trainer", "trainer-0", hub, extra)
    if cfg.trainer.ranks == 1:
        return argv
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={cfg.trainer.ranks}",
    ]
    return launcher + argv[1:]  # torchrun runs `-m grpo_stream.cli.main ...` per rank


def hub_service(cfg: RunConfig, config_path: Path, resume: bool) -> ServiceSpec:
    extra = ["--config", str(config_path)] + (["--resume"] if resume else [])
    return ServiceSpec(
        "grouper-0",
        "grouper",
        service_argv("grouper", "grouper-0", None, extra),
        restarts_left=cfg.run.restarts,
    )


def security_args(cfg: RunConfig) -> list[str]:
    """What every non-hub service is given to join the hub: the CURVE keys and the run's
    secret (the hub reads both from the run config)."""
    keys = ["--keys-dir", str(cfg.security.keys_dir)] if cfg.security.curve else []
    secret = cfg.security.secret_file
    return keys + ([] if secret is None else ["--secret-file", str(secret)])


def scorer_count(cfg: RunConfig) -> int:
    """Scorers to start: none for episodes no scorer can replay (their generator's
    environment rewards them; the hub logs `env.rewards_trusted`)."""
    return 0 if generator_rewards(cfg.env) else cfg.scorer.count


def teacher_count(cfg: RunConfig) -> int:
    """Teachers to start: teacher.count when algo.distill.teacher is set, else none."""
    return cfg.teacher.count if cfg.algo.distill.teacher is not None else 0


def local_specs(cfg: RunConfig, hub: str, resume: bool) -> list[ServiceSpec]:
    """Trainer, generators, scorers, and the evaluator and teachers where the run asks for
    them, on this machine, as the config counts them (in this order)."""
    keys = security_args(cfg)
    n = cfg.run.restarts
    specs = [
        ServiceSpec(
            "trainer-0",
            "trainer",
            trainer_argv(cfg, hub, keys + (["--resume"] if resume else [])),
            restarts_left=n,
        )
    ]
    evaluators = 1 if cfg.eval.every > 0 else 0  # evaluation during training: one evaluator
    for service, count in [
        ("generator", cfg.generator.count),
        ("scorer", scorer_count(cfg)),
        ("evaluator", evaluators),
        ("teacher", teacher_count(cfg)),  # distillation: teachers beside the scorers
    ]:
        for i in range(count):
            argv = service_argv(service, f"{service}-{i}", hub, keys)
            specs.append(ServiceSpec(f"{service}-{i}", service, argv, restarts_left=n))
    return specs


class Up:
    """One `grpo-stream up` invocation."""

    def __init__(
        self,
        cfg: RunConfig,
        config_path: Path,
        resume: bool,
        console: RunConsole,
        place_hub: Callable[[ServiceSpec], ServiceSpec] | None = None,
        runner: Runner | None = None,
    ) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.resume = resume
        self.console = console
        self.sup: Runner = Supervisor() if runner is None else runner
        self.run_dir = Path(cfg.run.run_dir)
        self.steps = 0
        self.trainer_done = False
        self._interrupted = False
        self._clean_exits: list[tuple[Launched, float]] = []  # exited 0: asked to, or not?
        self.place_hub = place_hub  # cluster runs: start the hub through its host's launcher
        self.dashboard = DashboardProcess(cfg, console.note)  # the run's web page

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._interrupted = True

    def hub_spec(self) -> ServiceSpec:
        """The hub as it starts (also what `up --dry-run` prints)."""
        hub_spec = hub_service(self.cfg, self.config_path, self.resume)
        return hub_spec if self.place_hub is None else self.place_hub(hub_spec)

    def start_hub(self, timeout_s: float = 120.0) -> str:
        """Start the hub; its address, from its `hub.started` event (which reaches `up`
        through any launcher) or from RUN_DIR/hub.addr where `up` shares the directory."""
        addr_file = self.run_dir / "hub.addr"
        addr_file.unlink(missing_ok=True)
        hub_spec = self.hub_spec()
        self.sup.start(hub_spec)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            events = self.sup.drain(0.1)
            self._show(events)
            for proc, code in self.sup.exited():
                raise LaunchError(
                    f"hub exited with code {code} on {proc.spec.host}: {_why(proc.tail)}"
                )
            address = _started_at(events)
            if address is None and addr_file.exists():
                address = addr_file.read_text().strip() or None
            if address is not None:
                # a restarted hub must come back where the services look for it
                hub_spec.argv += ["--set", f'hub.bind="{_bound(address, self.cfg.hub.bind)}"']
                return address
        raise LaunchError(f"hub did not start within {timeout_s:.0f}s (no hub.started event)")

    def run(self, specs_for_hub: Any = None) -> UpResult:
        """Start, watch and stop the run; RUN_DIR/outcome.json says how it ended (written
        before the dashboard stops, so its open pages show the end, not a lost connection)."""
        old = signal.signal(signal.SIGINT, self._on_signal)
        old_term = signal.signal(signal.SIGTERM, self._on_signal)
        failure = ""
        try:
            hub = self.start_hub()
            specs = specs_for_hub(hub) if specs_for_hub else local_specs(self.cfg, hub, self.resume)
            for spec in specs:
                self.sup.start(spec)
            self.dashboard.start()
            self.console.started(hub, [s.instance for s in specs], self.cfg.run.max_steps)
            self._watch()
        except LaunchError as exc:
            failure = str(exc)
            raise
        except Exception as exc:  # a fault of `up` itself: still say how the run ended
            failure = f"up stopped on {exc!r}"
            raise
        finally:
            self._shutdown()
            signal.signal(signal.SIGINT, old)
            signal.signal(signal.SIGTERM, old_term)
            ended: Ended = (
                "failed" if failure else "completed" if self.trainer_done else "interrupted"
            )
            write_outcome(self.run_dir, ended, self.steps, failure)
            self.dashboard.stop()
            self.console.finished(self.steps, self.run_dir)
        return UpResult(self.trainer_done, self.steps, self.run_dir)

    def _watch(self) -> None:
        while not self.trainer_done:
            if self._interrupted:
                self.console.note("interrupted: stopping the trainer first (final checkpoint)")
                self.sup.stop("trainer-0", grace_s=120)
                return
            self._show(self.sup.drain(0.2))
            self.dashboard.poll()
            exits = self.sup.exited()
            for proc, code in exits:
                if proc.spec.service == "trainer" and code == 0:
                    self.trainer_done = True
            for proc, code in exits:
                self._on_exit(proc, code)
            if not self.trainer_done:
                self._restart_unasked(time.monotonic())

    def _on_exit(self, proc: Launched, code: int) -> None:
        spec = proc.spec
        if code == 0:  # the trainer finishing ends the run; anything else is asked to wait
            self._clean_exits.append((proc, time.monotonic()))
            return
        if code == EXIT_ABORTED and spec.service == "grouper":
            raise LaunchError(f"the hub stopped the run: {_why(proc.tail)}")
        self._restart(proc, code, f"exited with code {code}")

    def _restart_unasked(self, now: float) -> None:
        """Clean exits that no end of the run followed: the service stopped on its own."""
        due = [p for p, t in self._clean_exits if now - t > CLEAN_EXIT_GRACE_S]
        self._clean_exits = [(p, t) for p, t in self._clean_exits if p not in due]
        for proc in due:
            self._restart(proc, 0, "exited with code 0 without being asked to")

    def _restart(self, proc: Launched, code: int, what: str) -> None:
        spec = proc.spec
        if spec.restarts_left > 0:
            spec.restarts_left -= 1
            self.console.note(f"{spec.instance} on {spec.host} {what}; restarting")
            self.sup.start(_restart_argv(spec))
            return
        raise LaunchError(
            f"{spec.instance} ({spec.service}) on {spec.host} exited with code {code}: "
            f"{_why(proc.tail)}"
        )

    def _show(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            if event.get("event") == "trainer.step":
                self.steps = int(event.get("step", self.steps))
            self.console.event(event)

    def _shutdown(self) -> None:
        self._show(self.sup.drain(0.05))
        self.sup.stop_all(grace_s=20)
        self._show(self.sup.drain(0.05))


def _started_at(events: list[dict[str, Any]]) -> str | None:
    """The public address in a `hub.started` event among `events`, if there is one."""
    for event in events:
        if event.get("event") == "hub.started" and event.get("public"):
            return str(event["public"])
    return None


def _bound(public: str, bind: str) -> str:
    """The bind address with the port the hub actually got."""
    return f"{bind.rsplit(':', 1)[0]}:{public.rsplit(':', 1)[1]}"


def _restart_argv(spec: ServiceSpec) -> ServiceSpec:
    if spec.service in ("trainer", "grouper") and "--resume" not in spec.argv:
        spec.argv = [*spec.argv, "--resume"]
    return spec


def _why(tail: Any) -> str:
    lines = [line for line in tail if line.strip()]
    return lines[-1] if lines else "no output"
