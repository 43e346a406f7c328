"""Atomic trainer checkpoints in Hugging Face format plus trainer state.

Layout: RUN_DIR/checkpoints/step-N/ holds the model (`save_pretrained`, safetensors), the
tokenizer, `trainer_state.pt` (optimizer, scheduler, regularizer, step, version, RNG) and a
`COMPLETE` marker. Everything is written into a temporary sibling directory first, the
marker last, then the directory is renamed into place: a crash while writing leaves only a
`.tmp-*` directory that is ignored (and removed later), never a half checkpoint.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import structlog
import torch

from grpo_stream.progress import long_wait

if TYPE_CHECKING:
    from grpo_stream.training.state import TrainState

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


def rng_state() -> dict[str, Any]:
    """RNG states as tensors and plain lists, so torch.load(weights_only=True) can read them."""
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state(legacy=True)
    return {
        "torch": torch.get_rng_state(),
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [
            np_name,
            torch.from_numpy(np.asarray(np_keys).astype(np.int64)),
            np_pos,
            np_has_gauss,
            np_gauss,
        ],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, py_state, gauss = state["python"]
    random.setstate((version, tuple(py_state), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))


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


def gather_trainer_state(
    state: TrainState,
) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any]]:
    """(the full weights gathered under FSDP2, else None: the model holds them; what
    trainer_state.pt holds: optimizer, scheduler, regularizer, rollback guard, step,
    version). Under FSDP2 collective: every rank calls it, rank 0 gets the unsharded state."""
    weights, optimizer = None, None
    if state.fsdp:
        from grpo_stream.training.fsdp import full_model_state, full_optimizer_state

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


def restore_trainer_state(state: TrainState, path: Path) -> None:
    """Load trainer_state.pt of checkpoint `path` into `state` (its weights are loaded with
    the model)."""
    saved = load_trainer_state(path)
    if state.fsdp:
        from grpo_stream.training.fsdp import load_optimizer_state

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
