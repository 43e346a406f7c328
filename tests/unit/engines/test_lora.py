"""The hf engine applying LoRA adapter versions as the trainer publishes them."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import zmq

from grpo_stream.engines.hf import HFEngine
from grpo_stream.models.adapter import AdapterError, LoraSettings
from grpo_stream.training.lora import wrap_policy
from grpo_stream.transport.settings import SecuritySettings, TransportSettings
from grpo_stream.transport.weights import WeightServer

IDS = torch.tensor([[3, 9, 14, 20, 7, 5]])


def trained_adapter(base: Any, seed: int, name: str = "tiny") -> tuple[Any, list[Any]]:
    """(the trainer's peft model, its published version): a copy of `base` wrapped by the
    trainer's code, with every adapter weight moved as training would."""
    settings = LoraSettings(enabled=True, r=4, alpha=8)
    wrapped, policy = wrap_policy(copy.deepcopy(base), settings, name, None)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in wrapped.named_parameters():
            if ".lora_" in n:
                p.add_(0.2 * torch.randn(p.shape, generator=gen))
    return wrapped.eval(), [(n, t.detach().clone()) for n, t in policy.named_weights(wrapped)]


def logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = model(input_ids=IDS).logits
    return out


@pytest.fixture
def base(hf_engine: HFEngine) -> Any:
    return copy.deepcopy(hf_engine.model)


def test_engine_matches_the_trainers_adapted_model(hf_engine: HFEngine, base: Any) -> None:
    trainer_model, version = trained_adapter(base, seed=1)
    hf_engine.load_weights(version, 1)
    assert hf_engine.version == 1
    torch.testing.assert_close(logits(hf_engine.model), logits(trainer_model))
    assert not torch.allclose(logits(hf_engine.model), logits(base))


def test_unmerged_mode_matches_too(hf_engine: HFEngine, base: Any) -> None:
    from grpo_stream.engines.lora import HFAdapter

    trainer_model, version = trained_adapter(base, seed=1)
    hf_engine._lora = HFAdapter(hf_engine.model, merge=False)
    hf_engine.load_weights(version, 1)
    torch.testing.assert_close(logits(hf_engine.model), logits(trainer_model))


def test_versions_replace_each_other_without_accumulating(hf_engine: HFEngine, base: Any) -> None:
    _, first = trained_adapter(base, seed=1)
    second_model, second = trained_adapter(base, seed=2)
    hf_engine.load_weights(first, 1)
    once = logits(hf_engine.model)
    hf_engine.load_weights(second, 2)
    torch.testing.assert_close(logits(hf_engine.model), logits(second_model))
    hf_engine.load_weights(first, 3)
    assert torch.equal(logits(hf_engine.model), once)  # merged from the kept base each time


def test_adapter_for_another_base_is_refused_and_nothing_applied(
    hf_engine: HFEngine, base: Any
) -> None:
    _, good = trained_adapter(base, seed=1)
    hf_engine.load_weights(good, 1)
    before = logits(hf_engine.model)
    other = copy.deepcopy(base)
    with torch.no_grad():
        other.model.layers[0].mlp.up_proj.weight.mul_(1.5)
    _, foreign = trained_adapter(other, seed=3, name="other-base")
    with pytest.raises(AdapterError, match=r"model\.name_or_path") as err:
        hf_engine.load_weights(foreign, 2)
    assert "other-base" in str(err.value) and "\n" not in str(err.value)
    assert hf_engine.version == 1
    assert torch.equal(logits(hf_engine.model), before)


def test_incomplete_adapter_version_is_refused_before_any_write(
    hf_engine: HFEngine, base: Any
) -> None:
    _, good = trained_adapter(base, seed=1)
    hf_engine.load_weights(good, 1)
    before = logits(hf_engine.model)
    _, newer = trained_adapter(base, seed=2)
    with pytest.raises(AdapterError, match="do not match its manifest"):
        hf_engine.load_weights(newer[1:], 2)  # a tensor lost on the way
    assert torch.equal(logits(hf_engine.model), before)


@pytest.fixture
def weight_server() -> Iterator[WeightServer]:
    ctx: zmq.Context[Any] = zmq.Context()
    server = WeightServer(
        ctx, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", TransportSettings(), SecuritySettings()
    )
    yield server
    server.close()
    ctx.destroy(linger=0)


def test_update_from_server_applies_an_adapter_version(
    hf_engine: HFEngine, base: Any, weight_server: WeightServer
) -> None:
    trainer_model, version = trained_adapter(base, seed=4)
    snapshot = weight_server.publish(7, version)
    full = sum(p.numel() * p.element_size() for p in base.parameters())
    assert snapshot.total_bytes < full / 4  # only the adapter travelled
    assert hf_engine.update_from_server(weight_server.addresses["weights"], -1) == 7
    torch.testing.assert_close(logits(hf_engine.model), logits(trainer_model))
