"""What `up` does before it starts any service: pre-flight, the run directory's lock, and
the refusal to overwrite a finished run. Every failure is one line (`StartError`)."""

from __future__ import annotations

from pathlib import Path

from grpo_stream.config import RunConfig
from grpo_stream.preflight import PreflightError, preflight
from grpo_stream.rundir.final import complete_steps
from grpo_stream.rundir.lock import RunLock, RunLocked, acquire, export_owner
from grpo_stream.rundir.outcome import clear_outcome


class StartError(RuntimeError):
    """The run cannot start; the message is one line saying why and what to do."""


def start_run(cfg: RunConfig, resume: bool, local_model: bool = True) -> RunLock:
    """Check the inputs (creating nothing), then take the run directory. The lock is held
    until the returned RunLock is released or this process ends; the services started after
    this run under it."""
    try:
        preflight(cfg, local_model=local_model)
    except PreflightError as exc:
        raise StartError(str(exc)) from None
    rd = Path(cfg.run.run_dir)
    try:
        lock = acquire(rd, "up")
    except RunLocked as exc:
        raise StartError(str(exc)) from None
    if lock is None:  # only a hub started by `up` runs under another's lock
        raise StartError(f"{rd} is held by the `up` that started this process")
    try:
        check_run_dir_state(cfg, resume)
    except StartError:
        lock.release()
        raise
    export_owner(lock)
    clear_outcome(rd)
    return lock


def check_run_dir_state(cfg: RunConfig, resume: bool) -> None:
    """What the run directory holds agrees with the command: a new run needs a directory
    without one; a resume needs steps left to train (run.max_steps above its last
    checkpoint). `up --check` asks the same, so it never passes what `up` then refuses."""
    rd = Path(cfg.run.run_dir)
    if not resume and (rd / "metrics.jsonl").exists():
        raise StartError(
            f"{rd} already holds a run: pass --resume to continue it or --run-dir for a new one"
        )
    done = max(complete_steps(rd), default=0) if resume else 0
    if done >= cfg.run.max_steps:
        raise StartError(
            f"{rd} has trained {done} steps and run.max_steps is {cfg.run.max_steps}: pass "
            f"--max-steps N (more than {done}) to train it further"
        )
