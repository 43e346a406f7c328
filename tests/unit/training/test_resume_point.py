"""Two gloo ranks agree where to resume when their run directories differ (no shared
filesystem: rank 0's node holds the checkpoints): a rank without rank 0's checkpoint gets its
trainer state from rank 0 and starts from the base weights (DDP then broadcasts rank 0's)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from grpo_stream.training.checkpoint import MARKER, ResumeError, resume_point

WORLD = 2
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # two spawned ranks import torch


def _checkpoint(run_dir: Path, step: int) -> Path:
    path = run_dir / "checkpoints" / f"step-{step}"
    path.mkdir(parents=True)
    torch.save({"step": step, "version": step + 1, "optimizer": {"lr": torch.tensor(0.5)}},
               path / "trainer_state.pt")  # fmt: skip
    (path / MARKER).touch()
    return path


def _one(rank: int, dirs: list[str], sharded: bool) -> dict[str, Any]:
    try:
        weights, ckpt, sent = resume_point(Path(dirs[rank]), True, rank, WORLD, sharded)
    except ResumeError as exc:
        return {"error": str(exc)}
    return {
        "weights": None if weights is None else str(weights),
        "ckpt": None if ckpt is None else str(ckpt),
        "sent": None if sent is None else {"step": sent["step"], "version": sent["version"],
                                           "lr": float(sent["optimizer"]["lr"])},
    }  # fmt: skip


def _rank(rank: int, port: int, cases: dict[str, tuple[list[str], bool]], out: str) -> None:
    """Every case in one process group (two processes importing torch take a while)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        rows = {name: _one(rank, dirs, sharded) for name, (dirs, sharded) in cases.items()}
    finally:
        dist.destroy_process_group()
    Path(out, f"{rank}.json").write_text(json.dumps(rows))


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Each case's two ranks: run directories as their nodes hold them, and the rows."""
    root = tmp_path_factory.mktemp("resume")
    cases: dict[str, tuple[list[str], bool]] = {}
    for name, (zero, one, sharded) in CASES.items():
        dirs = [root / name / "node0", root / name / "node1"]
        for d, steps in zip(dirs, (zero, one), strict=True):
            d.mkdir(parents=True)
            for step in steps:
                _checkpoint(d, step)
        cases[name] = ([str(d) for d in dirs], sharded)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_rank, args=(port, cases, str(root)), nprocs=WORLD, start_method="spawn")
    rows = [json.loads((root / f"{r}.json").read_text()) for r in range(WORLD)]
    out = {name: [rows[0][name], rows[1][name]] for name in CASES}
    return out | {"root": [{"path": str(root)}]}


CASES = {  # rank 0's checkpoints, rank 1's, FSDP2
    "missing": ((2, 4), (2,), False),
    "both": ((4,), (4,), False),
    "none": ((), (4,), False),
    "fsdp2": ((4,), (), True),
}


def _dir(resumed: dict[str, list[dict[str, Any]]], case: str, node: int) -> Path:
    return Path(resumed["root"][0]["path"]) / case / f"node{node}"


def test_a_rank_without_the_checkpoint_gets_rank_zeros_state(
    resumed: dict[str, list[dict[str, Any]]],
) -> None:
    zero, one = resumed["missing"]
    path = _dir(resumed, "missing", 0) / "checkpoints" / "step-4"
    assert zero["weights"] == zero["ckpt"] == str(path)
    assert one["weights"] is None  # the base weights; DDP broadcasts rank 0's
    assert one["ckpt"] == str(_dir(resumed, "missing", 1) / "checkpoints" / "step-4")
    assert zero["sent"] == one["sent"] == {"step": 4, "version": 5, "lr": 0.5}


def test_ranks_that_all_hold_the_checkpoint_read_their_own(
    resumed: dict[str, list[dict[str, Any]]],
) -> None:
    rows = resumed["both"]
    assert [r["sent"] for r in rows] == [None, None]
    assert [r["weights"] for r in rows] == [
        str(_dir(resumed, "both", n) / "checkpoints" / "step-4") for n in (0, 1)
    ]


def test_no_checkpoint_on_rank_zero_starts_every_rank_fresh(
    resumed: dict[str, list[dict[str, Any]]],
) -> None:
    assert resumed["none"] == [{"weights": None, "ckpt": None, "sent": None}] * 2


def test_fsdp2_refuses_to_resume_without_the_checkpoint_everywhere(
    resumed: dict[str, list[dict[str, Any]]],
) -> None:
    assert all("ranks [1] have none" in r["error"] for r in resumed["fsdp2"]), resumed["fsdp2"]
