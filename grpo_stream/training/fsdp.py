"""FSDP2 for the trainer's ranks: shard the policy, gather full state, load it back.

Each decoder layer of the Hugging Face causal LM (`model.model.layers`) is its own
`fully_shard` unit, then the root takes what is left (embeddings, tied head, final norm).
Every parameter becomes a DTensor sharded on dim 0 across the ranks; a forward all-gathers
one layer at a time and backward reduce-scatters (averages) each layer's gradient as soon as
it is ready, so the gradient traffic overlaps the rest of backward, as DDP's buckets do.

Invariants:
- `shard_model`, `full_*_state`, `load_optimizer_state` and `max_over_ranks` are collective:
  all ranks call them at the same point of the step, in the same order, or the ranks hang.
- Gathered state is full (unsharded) CPU tensors on rank 0 and empty on every other rank;
  keys are the model's fully qualified names, as `model.state_dict()` of the unsharded model
  has them (the optimizer's state too is keyed by parameter name, not by index, so a DDP
  checkpoint resumes under FSDP2 and the other way round).
- The optimizer must be built over the sharded (DTensor) parameters, after `shard_model`.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard

from grpo_stream.collectives import collective_device

_GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True)
_LOAD = StateDictOptions(full_state_dict=True)  # every rank passes the full state


def shard_model(model: torch.nn.Module) -> torch.nn.Module:
    """Shard `model` in place: one FSDP2 unit per decoder layer, then the root."""
    layers: Any = model.model.layers  # type: ignore[union-attr]
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Collective: the unsharded weights, on the CPU of rank 0 ({} elsewhere). Tied
    parameters (embeddings and head) come back as one tensor under both names, as in the
    unsharded model's state dict, so publishing sends them once."""
    # full_state_dict gives plain tensors (its declared type also allows sharded ones)
    state = cast("dict[str, torch.Tensor]", get_model_state_dict(model, options=_GATHER))
    return retie(state, model)


def retie(state: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """`state` with every name of a shared parameter mapped to the first name's tensor."""
    first: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        owner = first.setdefault(id(param), name)
        if owner != name and owner in state and name in state:
            state[name] = state[owner]
    return state


def full_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """Collective: the unsharded optimizer state keyed by parameter name, on rank 0."""
    state: dict[str, Any] = get_optimizer_state_dict(model, optimizer, options=_GATHER)
    return state


def load_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Collective: shard a full optimizer state, passed on every rank, into `optimizer`. It
    may come from `full_optimizer_state` or from a DDP run's `optimizer.state_dict()`."""
    names = [name for name, _ in model.named_parameters()]  # the optimizer's order
    set_optimizer_state_dict(model, optimizer, state_by_name(state, names), options=_LOAD)


def state_by_name(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """An optimizer state with its parameters (indices, or names already) renamed to `names`,
    given in the optimizer's parameter order: the layout FSDP2 loads. (torch's own
    `Optimizer.load_state_dict` matches by position, so it reads either layout.)"""
    groups = state["param_groups"]
    keys = [key for group in groups for key in group["params"]]
    if len(keys) != len(names):
        raise ValueError(f"optimizer state holds {len(keys)} parameters, the model {len(names)}")
    name_of = dict(zip(keys, names, strict=True))
    return {
        "state": {name_of[key]: value for key, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [name_of[key] for key in group["params"]]} for group in groups
        ],
    }


def max_over_ranks(value: int) -> int:
    """Collective: the largest `value` any rank holds."""
    dist = torch.distributed
    count = torch.tensor([value], dtype=torch.int64, device=collective_device())
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())
