"""Atomic trainer checkpoints in Hugging Face format plus trainer state.

Layout: RUN_DIR/checkpoints/step-N/ holds the model (`save_pretrained`, safetensors), the
tokenizer, `trainer_state.pt` (optimizer, scheduler, regularizer, step, version, RNG) and a
`COMPLETE` marker. Everything is written into a temporary sibling directory first, the
marker last, then the directory is renamed into place: a crash while writing leaves only a
`.tmp-*` directory that is ignored (and removed later), never a half checkpoint.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any, Protocol

import structlog
import torch

from grpo_stream.algo.regularizer import GradRegularizer
from grpo_stream.algo.rollback import RollbackGuard
from grpo_stream.progress import long_wait
from grpo_stream.rng import rng_state, set_rng_state
from grpo_stream.training.fsdp import full_model_state, full_optimizer_state, load_optimizer_state

log = structlog.get_logger()
MARKER = "COMPLETE"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def checkpoint_root(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def complete_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of complete checkpoints, oldest first."""
    root = checkpoint_root(run_dir)
    found = []
    if root.is_dir():
        for child in root.iterdir():
            match = _STEP_DIR.match(child.name)
            if match and (child / MARKER).exists():
                found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = complete_checkpoints(run_dir)
    return found[-1][1] if found else None


class ResumeError(RuntimeError):
    """The ranks cannot resume together; the message is one line."""


def resume_point(
    run_dir: Path, resume: bool, rank: int, world: int, sharded: bool
) -> tuple[Path | None, Path | None, dict[str, Any] | None]:
    """Where this rank resumes from: (the checkpoint to load its weights from, or None for
    the base weights; the run's checkpoint; the trainer state rank 0 sent, or None to read it
    from that checkpoint). Rank 0's newest complete checkpoint is the run's. Ranks whose own
    run directory lacks it (no shared filesystem: the checkpoints are on rank 0's node) get
    rank 0's trainer_state.pt over torch.distributed and start from the base weights, which
    DDP replaces with rank 0's when it wraps the model."""
    local = latest_checkpoint(run_dir) if resume else None
    if world == 1:
        return local, local, None
    dist = torch.distributed
    chosen = [None if local is None else local.name]
    dist.broadcast_object_list(chosen, src=0)
    if chosen[0] is None:
        return None, None, None
    path = checkpoint_root(run_dir) / str(chosen[0])
    have = (path / MARKER).exists()
    every: list[bool | None] = [None] * world
    dist.all_gather_object(every, have)
    if all(every):
        return path, path, None
    if sharded:
        missing = [r for r, ok in enumerate(every) if not ok]
        raise ResumeError(
            f"trainer.parallel = fsdp2 resumes only when every rank's run directory holds "
            f"{path.name} (ranks {missing} have none): put run.run_dir on a shared filesystem"
        )
    sent = [load_trainer_state(path) if rank == 0 else None]
    dist.broadcast_object_list(sent, src=0)
    return (path if have else None), path, sent[0]


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: Any,
    tokenizer: Any,
    state: dict[str, Any],
    keep: int,
    model_state: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write step-N atomically and prune to the newest `keep` complete checkpoints.

    `model_state`: the full weights to write when `model` holds only a shard of them (FSDP2).
    """
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step}"
    tmp = root / f".tmp-step-{step}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    with long_wait("checkpoint.write", step=step, stage="model") as wait:
        if model_state is None:
            model.save_pretrained(tmp, safe_serialization=True)
        else:
            model.save_pretrained(tmp, state_dict=model_state, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        wait.fields["stage"] = "trainer_state"
        torch.save({**state, "rng": rng_state()}, tmp / "trainer_state.pt")
        (tmp / MARKER).write_text(f"{step}\n")
        wait.fields["stage"] = "fsync"
        _fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
    for _, old in complete_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stray in root.glob(".tmp-step-*"):
        if not stray.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(stray, ignore_errors=True)
    return final


def load_trainer_state(path: Path) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(path / "trainer_state.pt", weights_only=True)
    return state


class Resumable(Protocol):
    """What a trainer's checkpoint holds besides the weights (`training.state.TrainState`)."""

    model: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    regularizer: GradRegularizer
    guard: RollbackGuard
    step: int
    version: int
    fsdp: bool


def gather_trainer_state(
    state: Resumable,
) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any]]:
    """(the full weights gathered under FSDP2, else None: the model holds them; what
    trainer_state.pt holds: optimizer, scheduler, regularizer, rollback guard, step,
    version). Under FSDP2 collective: every rank calls it, rank 0 gets the unsharded state."""
    weights, optimizer = None, None
    if state.fsdp:
        weights = full_model_state(state.model)
        optimizer = full_optimizer_state(state.model, state.optimizer)
    saved = {
        "optimizer": state.optimizer.state_dict() if optimizer is None else optimizer,
        "scheduler": state.scheduler.state_dict(),
        "regularizer": state.regularizer.state_dict(),
        "rollback": state.guard.state_dict(),
        "step": state.step,
        "version": state.version,
    }
    return weights, saved


def restore_trainer_state(
    state: Resumable, path: Path, saved: dict[str, Any] | None = None
) -> None:
    """Load trainer_state.pt of checkpoint `path` (or `saved`, what rank 0 read there) into
    `state` (its weights are loaded with the model)."""
    saved = load_trainer_state(path) if saved is None else saved
    if state.fsdp:
        load_optimizer_state(state.model, state.optimizer, saved["optimizer"])
    else:
        state.optimizer.load_state_dict(saved["optimizer"])
    state.scheduler.load_state_dict(saved["scheduler"])
    state.regularizer.load_state_dict(saved["regularizer"])
    if "rollback" in saved:  # checkpoints before lr_scale was saved have none
        state.guard.load_state_dict(saved["rollback"])
    state.step = int(saved["step"])
    state.version = int(saved["version"])
    set_rng_state(saved["rng"])
    log.info(
        "trainer.resumed",
        path=str(path),
        step=state.step,
        version=state.version,
        tau=state.regularizer.tau,
        rollbacks=state.guard.total,
    )


def _fsync_dir(path: Path) -> None:
    for file in path.iterdir() if path.is_dir() else []:
        if file.is_file():
            with file.open("rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
