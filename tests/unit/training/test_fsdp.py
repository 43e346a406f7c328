"""Two gloo ranks on the CPU with trainer.parallel=fsdp2: the sharded step equals one process
on the whole step, the regularizer sees the global norm, checkpoints hold the full weights
and resume restores them with the optimizer state, and rollback restores each rank's shard.

One torchrun launch does all the distributed work (this file is its script) and leaves the
gathered results in one file; the tests below read it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_stream.cli.service_exit import end_service_process
from grpo_stream.config import RunConfig, load_config
from grpo_stream.protocols.messages import TrainBatch

sys.path.insert(0, str(Path(__file__).parent))  # trainstates
from trainstates import run_ranks, step_and_shards

WORLD = 2
GROUPS = 3  # uneven shards: rank 0 gets 8 sequences (3 micro-batches), rank 1 gets 4 (2)
slow = pytest.mark.slow  # the ranks' tests take over 20 s: torchrun, ranks loading models


def _batches() -> tuple[TrainBatch, list[TrainBatch]]:
    return step_and_shards(GROUPS, WORLD)


def _config(run_dir: Path, *sets: str) -> RunConfig:
    # micro_batch 3: several micro-batches per rank, and a different count on each rank
    base = [f"run.run_dir={json.dumps(str(run_dir))}", "trainer.micro_batch=3"]
    return load_config(None, [*base, "trainer.parallel=fsdp2", *sets])


def _rank(out: Path) -> None:
    """One rank, started by torchrun (which sets RANK, WORLD_SIZE, MASTER_ADDR/PORT)."""
    from grpo_stream.training.fsdp import full_optimizer_state
    from grpo_stream.training.state import TrainState

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    shard = _batches()[1][rank]
    state = TrainState.create(_config(out / "run"))
    assert state.fsdp
    result = state.train_step(shard)
    weights = dict(state.named_weights())  # collective: every rank joins
    checkpoint = state.checkpoint()
    optimizer = full_optimizer_state(state.model, state.optimizer)
    torch.distributed.barrier()  # rank 0 has written the checkpoint before any rank resumes
    resumed = TrainState.create(_config(out / "run"), resume=True)
    resumed_weights = dict(resumed.named_weights())
    resumed_optimizer = full_optimizer_state(resumed.model, resumed.optimizer)
    # restore points every 2 applied steps: the one taken at start; step 0 moves the weights,
    # step 1 fails and restores the start (a restore, not just a skipped step) on every shard
    every2 = ("trainer.fault_nan_step=1", "algo.rollback.snapshot_every=2")
    faulty = TrainState.create(_config(out / "fault", *every2))
    initial = dict(faulty.named_weights())
    assert faulty.train_step(shard).applied
    moved = dict(faulty.named_weights())
    rolled_back = faulty.train_step(shard)
    restored = dict(faulty.named_weights())
    ddp = TrainState.create(_config(out / "cross", "trainer.parallel=ddp"))
    assert ddp.train_step(shard).applied
    ddp.checkpoint()
    torch.distributed.barrier()
    cross = TrainState.create(_config(out / "cross"), resume=True)
    cross_optimizer = full_optimizer_state(cross.model, cross.optimizer)
    if rank == 0:
        results = {
            "applied": result.applied,
            "metrics": result.metrics,
            "weights": weights,
            "checkpoint": str(checkpoint),
            "optimizer": optimizer,
            "resumed_step": resumed.step,
            "resumed_weights": resumed_weights,
            "resumed_optimizer": resumed_optimizer,
            "rollback_applied": rolled_back.applied,
            "rollbacks": faulty.guard.total,
            "initial": initial,
            "moved": moved,
            "restored": restored,
            "ddp_optimizer": ddp.optimizer.state_dict(),
            "cross_optimizer": cross_optimizer,
        }
        torch.save(results, out / "fsdp.pt")
    end_service_process(0)  # as a trainer rank ends: torch's gloo teardown can deadlock


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What rank 0 saved after the two-rank FSDP2 run."""
    out = tmp_path_factory.mktemp("fsdp")
    run_ranks(__file__, out, WORLD)
    results: dict[str, Any] = torch.load(out / "fsdp.pt", weights_only=False)
    return results


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One process (no torch.distributed) training on the whole step."""
    from grpo_stream.training.state import TrainState

    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        for var in ("WORLD_SIZE", "RANK"):
            patch.delenv(var, raising=False)
        whole = _batches()[0]
        state = TrainState.create(_config(tmp_path_factory.mktemp("single")))
    before = {n: p.detach().clone() for n, p in state.model.named_parameters()}
    result = state.train_step(whole)
    after = {n: p.detach().clone() for n, p in state.model.named_parameters()}
    return {"result": result, "before": before, "after": after, "state": state}


@slow
def test_fsdp_step_on_uneven_shards_matches_one_process_on_the_whole_step(
    ranks: dict[str, Any], single: dict[str, Any]
) -> None:
    assert ranks["applied"] and single["result"].applied
    before, after = single["before"], single["after"]
    assert any(not torch.equal(before[n], after[n]) for n in after)  # the step moved weights
    for name, value in after.items():
        torch.testing.assert_close(ranks["weights"][name], value, rtol=1e-5, atol=1e-6, msg=name)


@slow
def test_fsdp_regularizer_norm_is_the_single_process_norm(
    ranks: dict[str, Any], single: dict[str, Any]
) -> None:
    expected = single["result"].metrics
    got = ranks["metrics"]
    for key in ("grad_norm", "grad_norm_after", "tau"):
        assert got[key] == pytest.approx(expected[key], rel=1e-5), key


@slow
def test_fsdp_published_weights_have_the_unsharded_names_and_keep_tied_tensors_shared(
    ranks: dict[str, Any], single: dict[str, Any]
) -> None:
    weights = ranks["weights"]
    assert set(weights) == set(single["state"].model.state_dict())
    assert all(type(t) is torch.Tensor for t in weights.values())  # plain, not DTensor
    tied = weights["lm_head.weight"], weights["model.embed_tokens.weight"]
    assert tied[0].data_ptr() == tied[1].data_ptr()  # so the weight server sends it once


@slow
def test_fsdp_checkpoint_loads_with_transformers_and_holds_the_gathered_weights(
    ranks: dict[str, Any],
) -> None:
    from transformers import AutoModelForCausalLM

    path = Path(ranks["checkpoint"])
    assert (path / "COMPLETE").exists()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert model.config.architectures == ["Qwen2ForCausalLM"]
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, ranks["weights"][name], rtol=0, atol=0, msg=name)


@slow
def test_fsdp_resume_restores_the_params_and_the_optimizer_state(ranks: dict[str, Any]) -> None:
    assert ranks["resumed_step"] == 1
    for name, value in ranks["weights"].items():
        torch.testing.assert_close(ranks["resumed_weights"][name], value, msg=name)
    saved, resumed = ranks["optimizer"], ranks["resumed_optimizer"]
    assert saved["state"]  # AdamW has moments after one step
    torch.testing.assert_close(resumed["state"], saved["state"], rtol=0, atol=0)
    assert _groups(resumed) == _groups(saved)


def _groups(optimizer_state: dict[str, Any]) -> list[dict[str, Any]]:
    # set_optimizer_state_dict hands betas back as a list; AdamW reads either
    return [{**g, "betas": tuple(g["betas"])} for g in optimizer_state["param_groups"]]


@slow
def test_fsdp_rollback_restores_every_shard(ranks: dict[str, Any]) -> None:
    assert not ranks["rollback_applied"]
    assert ranks["rollbacks"] == 1
    initial, moved = ranks["initial"], ranks["moved"]
    assert any(not torch.equal(initial[n], moved[n]) for n in initial)
    for name, value in initial.items():
        torch.testing.assert_close(ranks["restored"][name], value, rtol=0, atol=0, msg=name)


@slow
def test_fsdp2_resumes_a_ddp_checkpoint_with_its_optimizer_state(ranks: dict[str, Any]) -> None:
    ddp, cross = ranks["ddp_optimizer"], ranks["cross_optimizer"]
    names = cross["param_groups"][0]["params"]
    assert len(names) == len(ddp["state"])
    for index, name in enumerate(names):
        torch.testing.assert_close(cross["state"][name], ddp["state"][index], msg=name)


def test_state_by_name_renames_an_optimizer_state_by_position() -> None:
    from grpo_stream.training.fsdp import state_by_name

    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(4, 2)).sum().backward()
    optimizer.step()
    names = [name for name, _ in model.named_parameters()]
    state = optimizer.state_dict()
    renamed = state_by_name(state, names)
    assert renamed["param_groups"][0]["params"] == names
    assert list(renamed["state"]) == names
    torch.testing.assert_close(renamed["state"]["1.bias"], state["state"][3])
    again = state_by_name(renamed, names)  # names already: unchanged
    assert again["param_groups"] == renamed["param_groups"]
    assert list(again["state"]) == names


def test_state_by_name_rejects_a_state_of_another_model() -> None:
    from grpo_stream.training.fsdp import state_by_name

    state = {"state": {}, "param_groups": [{"params": [0, 1]}]}
    with pytest.raises(ValueError, match="holds 2 parameters, the model 3"):
        state_by_name(state, ["a", "b", "c"])


if __name__ == "__main__":
    _rank(Path(sys.argv[1]))
