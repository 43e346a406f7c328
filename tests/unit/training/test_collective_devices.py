"""Every torch.distributed collective of the trainer gets tensors on the trainer's device.

NCCL (GPU ranks) takes CUDA tensors only; gloo on the CPU takes anything the CPU holds, so
a collective given a host tensor passes every CPU test and fails the first GPU step. The
strict gloo of strict_collectives.py (this directory) makes that mistake fail here: the
host's default device is moved off the trainer's for the modules that use torch.distributed,
and each collective checks its tensors against the trainer's resolved device.

The fast tests use one gloo rank (a process group of one: the collectives run, and check);
the slow one runs two ranks under torchrun through FSDP2 and DDP steps with the regularizer,
a rollback, the weight gather and a checkpoint, then both ranks splitting the sequences of
a step (context parallelism) with a rollback (this file is its script).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_stream.cli.service_exit import end_service_process
from grpo_stream.config import RunConfig, load_config

sys.path.insert(0, str(Path(__file__).parent))  # strict_collectives, trainstates
from strict_collectives import (
    CollectiveDeviceError,
    HostDefaultElsewhere,
    distributed_modules,
    strict_collectives,
)
from trainstates import make_batch, run_ranks, step_and_shards

WORLD = 2
CONTEXT = ("trainer.ranks=2", "trainer.context_parallel=2")


def _config(run_dir: Path, *sets: str) -> RunConfig:
    base = [
        f"run.run_dir={json.dumps(str(run_dir))}",
        'trainer.device="cpu"',
        "trainer.micro_batch=3",  # several micro-batches per rank
        "trainer.fault_nan_step=1",  # the second step fails: a rollback
    ]
    return load_config(None, [*base, *sets])


def _trainer_device(cfg: RunConfig) -> str:
    from grpo_stream.training.device import resolve

    device, _ = resolve(cfg)
    return device


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    """A gloo process group of one rank (its collectives run and are checked)."""
    dist = torch.distributed
    store = tmp_path / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_the_modules_that_use_torch_distributed_are_found() -> None:
    found = distributed_modules()
    context = ("training.context.attention", "training.context.forward", "training.context.groups")
    for module in ("training.fsdp", "collectives", "algo.regularizer", "algo.rollback", *context):
        assert f"grpo_stream.{module}" in found
    assert "grpo_stream.training.batch" not in found  # builds host tensors by design


def test_a_device_less_tensor_of_a_distributed_module_lands_off_the_trainers_device() -> None:
    with HostDefaultElsewhere(frozenset({__name__})) as mode:
        made = torch.tensor([1])
        named = torch.zeros(1, device="cpu")
    assert made.device == torch.device("meta")
    assert named.device == torch.device("cpu")
    assert sum(mode.redirected.values()) == 1


def test_the_strict_gloo_refuses_a_tensor_off_the_trainers_device(one_rank: None) -> None:
    with (
        strict_collectives("cpu") as seen,
        pytest.raises(CollectiveDeviceError, match=r"all_reduce was given a tensor on meta"),
    ):
        torch.distributed.all_reduce(torch.zeros(1, device="meta"))
    assert not seen


def test_max_over_ranks_reduces_on_the_trainers_device(one_rank: None) -> None:
    from grpo_stream.training.fsdp import max_over_ranks

    with HostDefaultElsewhere(), strict_collectives("cpu") as seen:
        assert max_over_ranks(3) == 3
    assert seen["max_over_ranks"] == 1


def test_a_minibatch_step_with_a_rollback_keeps_collectives_on_the_trainers_device(
    one_rank: None, tmp_path: Path
) -> None:
    from grpo_stream.training.state import TrainState

    torch.set_num_threads(1)
    cfg = _config(tmp_path, "trainer.minibatches=2")
    with HostDefaultElsewhere(), strict_collectives(_trainer_device(cfg)) as seen:
        state = TrainState.create(cfg)
        applied = [state.train_step(make_batch(step)).applied for step in range(3)]
    assert applied == [True, False, True]  # the second rolled back
    assert state.guard.total == 1
    assert seen["global_grad_norm"] >= 2 and seen["check"] >= 2  # each minibatch of a step


def _rank(out: Path) -> None:
    """One rank under torchrun: FSDP2 then DDP steps, all inside the strict gloo."""
    from grpo_stream.training.context.groups import share_batch
    from grpo_stream.training.state import TrainState

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    shard = step_and_shards(4, WORLD)[1][rank]
    results: dict[str, Any] = {}
    device = _trainer_device(_config(out / "probe"))
    with HostDefaultElsewhere() as mode, strict_collectives(device) as seen:
        for parallel in ("fsdp2", "ddp"):
            state = TrainState.create(_config(out / parallel, f'trainer.parallel="{parallel}"'))
            applied = [state.train_step(shard).applied for _ in range(3)]
            dict(state.named_weights())  # collective under FSDP2
            state.checkpoint()
            results[parallel] = {"applied": applied, "rollbacks": state.guard.total}
            torch.distributed.barrier()
        # both ranks split every sequence of the whole step (one context group), its batch
        # shared by the leader
        state = TrainState.create(_config(out / "context", *CONTEXT))
        assert state.context is not None
        whole = step_and_shards(4, WORLD)[0] if state.context.leads else None
        batches = [share_batch(state.context, whole, lambda: None) for _ in range(3)]
        applied = [state.train_step(batch).applied for batch in batches if batch is not None]
        results["context"] = {"applied": applied, "rollbacks": state.guard.total}
    results["seen"] = dict(seen)
    results["redirected"] = dict(mode.redirected)
    if rank == 0:
        (out / "collectives.json").write_text(json.dumps(results))
    end_service_process(0)  # as a trainer rank ends: torch's gloo teardown can deadlock


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("collectives")
    run_ranks(__file__, out, WORLD)
    results: dict[str, Any] = json.loads((out / "collectives.json").read_text())
    return results


@pytest.mark.slow  # torchrun, two ranks loading the model twice: over 20 s
def test_fsdp2_and_ddp_steps_keep_every_collective_on_the_trainers_device(
    ranks: dict[str, Any],
) -> None:
    for parallel in ("fsdp2", "ddp", "context"):
        assert ranks[parallel] == {"applied": [True, False, True], "rollbacks": 1}, parallel
    seen = ranks["seen"]
    # context parallelism's: the shared batch, the attention's exchanges, the log-probs
    assert seen["share_batch"] >= 6 and seen["_all_to_all"] >= 6 and seen["forward"] >= 6
    # the call sites: FSDP2's micro-batch count, the sharded norm, the rollback guard (both)
    assert seen["max_over_ranks"] >= 2 and seen["global_grad_norm"] >= 2
    assert seen["check"] >= 6
    assert ranks["redirected"] == {}  # no device-less tensor left in those modules


if __name__ == "__main__":
    _rank(Path(sys.argv[1]))
