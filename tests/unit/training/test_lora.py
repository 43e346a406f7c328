"""LoRA training (trainer.lora): what is trained, the shared reference, what is published,
checkpoints, resume, rollback and the settings' bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from grpo_stream.config import ConfigError, RunConfig, load_config
from grpo_stream.hub.batches import build_batch
from grpo_stream.models.adapter import MANIFEST_NAME, AdapterError, split_adapter
from grpo_stream.protocols.messages import TrainBatch
from grpo_stream.training.state import TrainState

sys.path.insert(0, str(Path(__file__).parent))  # trainstates
from trainstates import random_group

LORA = ["trainer.lora.enabled=true", "trainer.lr=0.02"]


def _config(run_dir: Path, *extra: str) -> RunConfig:
    return load_config(None, [f"run.run_dir={json.dumps(str(run_dir))}", *LORA, *extra])


def _batch(step: int = 0, groups: int = 3) -> TrainBatch:
    rng = np.random.default_rng(step)
    made = [random_group(g, rng, rng.integers(2, 7, size=4), version=step) for g in range(groups)]
    return build_batch(step, made)


def _params(state: TrainState) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in state.model.named_parameters()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[TrainState, dict[str, Any]]:
    """A LoRA state (beta > 0) before and after two steps, then checkpointed."""
    torch.set_num_threads(1)
    state = TrainState.create(_config(tmp_path_factory.mktemp("lora"), "algo.loss.beta=0.05"))
    before = _params(state)
    for step in range(2):
        assert state.train_step(_batch(step)).applied
    return state, before


def test_only_the_adapter_is_in_the_optimizer(trained: tuple[TrainState, Any]) -> None:
    state, _ = trained
    names = {id(p): n for n, p in state.model.named_parameters()}
    in_optimizer = [names[id(p)] for g in state.optimizer.param_groups for p in g["params"]]
    assert in_optimizer and all(".lora_" in n for n in in_optimizer)
    assert len(in_optimizer) == sum(".lora_" in n for n in names.values())


def test_a_step_changes_the_adapter_and_not_the_base(trained: tuple[TrainState, Any]) -> None:
    state, before = trained
    after = _params(state)
    changed = {n for n in after if not torch.equal(before[n], after[n])}
    assert any("lora_B" in n for n in changed)
    assert changed and all(".lora_" in n for n in changed)


def test_reference_is_the_base_model_without_a_second_copy(
    trained: tuple[TrainState, Any],
) -> None:
    from grpo_stream.models.loading import load_policy

    state, _ = trained
    assert state.ref_model.model is state.model  # the policy itself, adapter disabled
    base = load_policy(state.cfg.model.name_or_path, dtype="float32", trainable=False)
    ids = torch.tensor([[5, 9, 12, 7, 3, 14]])
    with torch.no_grad():
        ref = state.ref_model(input_ids=ids).logits
        policy = state.model(input_ids=ids).logits
        expected = base(input_ids=ids).logits
    torch.testing.assert_close(ref, expected)
    assert not torch.allclose(policy, expected)  # the adapter is live outside the reference


def test_a_published_version_is_the_adapter_and_its_manifest(
    trained: tuple[TrainState, Any],
) -> None:
    state, _ = trained
    items = list(state.named_weights())
    assert items[-1][0] == MANIFEST_NAME
    found = split_adapter(items)
    assert found is not None
    manifest, tensors = found
    lora_params = [n for n, _ in state.model.named_parameters() if ".lora_" in n]
    assert len(tensors) == len(lora_params)
    assert all(n.startswith("base_model.model.") and ".lora_" in n for n, _ in tensors)
    assert manifest.r == 16 and manifest.scaling == manifest.alpha / manifest.r
    assert manifest.base_fingerprint == state.lora.fingerprint  # type: ignore[union-attr]


def test_checkpoint_is_a_peft_adapter_that_names_its_base(
    trained: tuple[TrainState, Any],
) -> None:
    from peft import PeftModel

    from grpo_stream.models.loading import load_policy, resolve_model

    state, _ = trained
    path = state.checkpoint()
    assert path is not None
    assert (path / "adapter_model.safetensors").exists()
    assert not (path / "model.safetensors").exists()
    config = json.loads((path / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == resolve_model(state.cfg.model.name_or_path)
    base = load_policy(config["base_model_name_or_path"], dtype="float32", trainable=False)
    loaded = PeftModel.from_pretrained(base, path)
    ids = torch.tensor([[4, 8, 15, 16, 23]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, state.model(input_ids=ids).logits)


def test_resume_restores_the_adapter_optimizer_and_version(tmp_path: Path) -> None:
    state = TrainState.create(_config(tmp_path))
    assert state.train_step(_batch(0)).applied
    state.checkpoint()
    resumed = TrainState.create(_config(tmp_path), resume=True)
    assert (resumed.step, resumed.version) == (1, 1)
    for name, value in _params(state).items():
        torch.testing.assert_close(_params(resumed)[name], value, msg=name)
    saved = state.optimizer.state_dict()["state"]
    loaded = resumed.optimizer.state_dict()["state"]
    assert saved.keys() == loaded.keys() and saved
    for key in saved:
        torch.testing.assert_close(loaded[key]["exp_avg"], saved[key]["exp_avg"])
    # both continue identically from here
    assert state.train_step(_batch(1)).applied and resumed.train_step(_batch(1)).applied
    for name, value in _params(state).items():
        torch.testing.assert_close(_params(resumed)[name], value, msg=name)


def test_rollback_restores_the_adapter(tmp_path: Path) -> None:
    state = TrainState.create(_config(tmp_path, "trainer.fault_nan_step=1"))
    assert state.train_step(_batch(0)).applied
    state.checkpoint()  # snapshot here
    good = _params(state)
    assert not state.train_step(_batch(1)).applied  # NaN loss: rolled back
    for name, value in _params(state).items():
        assert torch.equal(value, good[name]), name
    assert state.train_step(_batch(1)).applied


def test_rollback_snapshot_holds_the_adapter_and_its_moments_not_the_base(
    tmp_path: Path,
) -> None:
    state = TrainState.create(_config(tmp_path))
    assert state.train_step(_batch(0)).applied  # takes the restore point
    adapter = [p for p in state.model.parameters() if p.requires_grad]
    moments = [v for s in state.optimizer.state.values() for v in s.values()]
    size = sum(t.numel() * t.element_size() for t in [*adapter, *moments])
    base = sum(p.numel() * p.element_size() for p in state.model.parameters())
    assert state.guard.snapshot_bytes == size < base


def test_target_modules_naming_nothing_is_one_line_naming_the_setting(tmp_path: Path) -> None:
    cfg = _config(tmp_path, 'trainer.lora.target_modules=["nope_proj"]')
    with pytest.raises(AdapterError, match=r"trainer\.lora\.target_modules") as err:
        TrainState.create(cfg)
    assert "\n" not in str(err.value) and "q_proj" in str(err.value)  # says what exists


def test_modules_peft_cannot_adapt_are_one_line(tmp_path: Path) -> None:
    cfg = _config(tmp_path, 'trainer.lora.target_modules=["input_layernorm"]')
    with pytest.raises(AdapterError, match=r"trainer\.lora: peft cannot adapt") as err:
        TrainState.create(cfg)
    assert "\n" not in str(err.value)


def test_lora_with_fsdp2_is_refused_naming_the_settings(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"trainer\.lora\.enabled.*fsdp2"):
        _config(tmp_path, "trainer.ranks=2", "trainer.parallel=fsdp2", "hub.groups_per_step=4")
