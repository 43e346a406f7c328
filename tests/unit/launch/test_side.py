"""GPUs for the evaluator and for scorers that run a reward model (launch/side.py), over
recorded NVML fingerprints (NVML replaced at its boundary), with a real reward model built
here (its bytes are read from its safetensors headers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_stream.config import RunConfig, load_config
from grpo_stream.hardware.recorded import RecordedNvml, load_record
from grpo_stream.launch.devices import (
    local_fingerprint,
    local_host,
    model_bytes,
    placement_over,
    remember,
)
from grpo_stream.launch.placed import dry_run_lines, placed_services
from grpo_stream.launch.placement import Placement, PlacementError
from grpo_stream.launch.side import side_needs

SMALL = 100_000_000
GIB = 2**30


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A tiny one-label classifier saved as transformers does; (path, bytes of its tensors
    as the model holds them)."""
    from transformers import Qwen2ForSequenceClassification

    from grpo_stream.models.testing import qwen2_config

    path = tmp_path_factory.mktemp("rm")
    config = qwen2_config(260, hidden=32, kv_heads=2, num_labels=1, pad_token_id=0)
    model = Qwen2ForSequenceClassification(config)
    model.save_pretrained(path)
    tensors = {t.data_ptr(): t for t in model.state_dict().values()}  # tied: once
    return path, sum(t.numel() * t.element_size() for t in tensors.values())


def _cfg(*sets: str, params: int = SMALL) -> RunConfig:
    return load_config(None, [f"model.params={params}", *sets])


def _rm(path: Path, **params: str) -> str:
    """task.rewards = one reward_model (a TOML inline table)."""
    inner = ", ".join(f"{k} = {json.dumps(v)}" for k, v in params.items())
    spec = f'name = "reward_model", path = {json.dumps(str(path))}, params = {{{inner}}}'
    return f"task.rewards=[{{{spec}}}]"


def _place(cfg: RunConfig, *gpus: str, init_error: str | None = None) -> Placement:
    nvml = RecordedNvml([load_record(n) for n in gpus], init_error=init_error)
    return placement_over(cfg, [local_host(cfg, local_fingerprint(nvml), {})])


def _env(cfg: RunConfig, placement: Placement) -> dict[str, str | None]:
    services = placed_services(cfg, placement, "tcp://h:1", False)
    return {s.instance: s.env.get("CUDA_VISIBLE_DEVICES") for s, _ in services}


def test_a_reward_models_bytes_are_read_from_its_safetensors(
    reward_model: tuple[Path, int],
) -> None:
    path, nbytes = reward_model
    assert model_bytes(str(path)) == nbytes
    assert model_bytes("some-org/reward-model") is None  # a hub name: unknown


def test_each_reward_worker_is_budgeted_a_copy_and_a_cuda_context(
    reward_model: tuple[Path, int],
) -> None:
    path, nbytes = reward_model
    cfg = _cfg(_rm(path), "scorer.workers=3")
    need = side_needs(cfg, "plan", SMALL, {str(path): nbytes})["scorer"]
    assert need is not None and not need.required
    assert need.nbytes == 3 * (int(nbytes * 1.5) + GIB // 2)  # generator_headroom, overhead


def test_an_idle_gpu_goes_to_the_evaluator() -> None:
    cfg = _cfg("eval.every=5", "task.holdout=0.1", "generator.tensor_parallel=2")
    placement = _place(cfg, *["h100-sxm"] * 4)  # trainer 0, generator 1-2, GPU 3 idle
    env = _env(cfg, placement)
    assert env["evaluator-0"] == "3"
    assert env["scorer-0"] == ""  # its rewards need no GPU
    assert placement.idle == ()


def test_the_evaluator_shares_the_gpu_with_the_most_memory_left() -> None:
    cfg = _cfg("eval.every=5", "task.holdout=0.1")
    placement = _place(cfg, "h100-sxm", "h100-sxm")  # trainer on 0, generator on 1
    # the trainer's rule (21.6 B/param) leaves less on GPU 0 than the generator's (3 B)
    assert _env(cfg, placement)["evaluator-0"] == "1"
    lines = dry_run_lines(placement, placed_services(cfg, placement, "tcp://h:1", False))
    assert any(line.startswith("evaluator-0") and "devices=" in line and "devices=-" not in line
               for line in lines)  # fmt: skip


def test_a_scorer_running_a_reward_model_gets_a_gpu(reward_model: tuple[Path, int]) -> None:
    cfg = _cfg(_rm(reward_model[0]), "scorer.count=2")
    env = _env(cfg, _place(cfg, "h100-sxm", "h100-sxm"))
    assert env["scorer-0"] in ("0", "1") and env["scorer-1"] in ("0", "1")


def test_a_reward_model_kept_on_the_cpu_gets_no_gpu(reward_model: tuple[Path, int]) -> None:
    cfg = _cfg(_rm(reward_model[0], device="cpu"), "eval.every=5", "task.holdout=0.1",
               'eval.device="cpu"')  # fmt: skip
    env = _env(cfg, _place(cfg, "h100-sxm", "h100-sxm"))
    assert env["scorer-0"] == "" and env["evaluator-0"] == ""


# 2 x T4 (15 GiB), a 700M policy: the trainer leaves 0.9 GiB on GPU 0, vLLM reserves 90% of
# GPU 1; the evaluator needs 2.0 GiB for the policy and 0.5 for its CUDA context.
TIGHT = (
    "eval.every=5",
    "task.holdout=0.1",
    'generator.engine="vllm"',
    "generator.gpu_memory_utilization=0.9",
)


def test_auto_runs_on_the_cpu_with_a_note_when_no_gpu_has_room() -> None:
    cfg = _cfg(*TIGHT, params=700_000_000)
    placement = _place(cfg, "t4", "t4")
    assert _env(cfg, placement)["evaluator-0"] == ""
    assert len(placement.notes) == 1
    assert placement.notes[0].startswith("evaluator on local runs on the CPU: it needs 2.5 GiB")


def test_cuda_without_room_is_an_error_naming_the_setting() -> None:
    cfg = _cfg(*TIGHT, 'eval.device="cuda"', params=700_000_000)
    with pytest.raises(PlacementError, match=r'^eval\.device = "cuda": no GPU for the evaluator'):
        _place(cfg, "t4", "t4")


def test_a_gpu_index_is_refused_under_gpu_placement() -> None:
    cfg = _cfg("eval.every=5", "task.holdout=0.1", 'eval.device="cuda:1"')
    with pytest.raises(PlacementError, match=r'eval\.device = "cuda:1" names a GPU'):
        _place(cfg, "h100-sxm", "h100-sxm")


def test_a_reward_model_of_unknown_size_runs_on_the_cpu_unless_cuda_is_asked() -> None:
    cfg = _cfg(_rm(Path("some-org/reward-model")))
    placement = _place(cfg, "h100-sxm", "h100-sxm")
    assert _env(cfg, placement)["scorer-0"] == ""
    assert "size is unknown" in placement.notes[0]
    insist = _cfg(_rm(Path("some-org/reward-model"), device="cuda"))
    with pytest.raises(PlacementError, match=r"task\.rewards\[0\]\.params\.device"):
        _place(insist, "h100-sxm", "h100-sxm")


def test_cuda_on_a_host_without_gpus_fails_before_anything_starts() -> None:
    cfg = _cfg("eval.every=5", "task.holdout=0.1", 'eval.device="cuda"')
    with pytest.raises(PlacementError, match=r'eval\.device = "cuda" but NVML sees no GPU'):
        _place(cfg, init_error="NVMLError_DriverNotLoaded")
    auto = _cfg("eval.every=5", "task.holdout=0.1")
    assert _place(auto, init_error="NVMLError_DriverNotLoaded").mode == "none"


def test_a_resumed_run_keeps_the_side_services_gpus(
    tmp_path: Path, reward_model: tuple[Path, int]
) -> None:
    cfg = _cfg(_rm(reward_model[0]), "eval.every=5", "task.holdout=0.1", "scorer.count=2")
    nvml = RecordedNvml([load_record("h100-sxm")] * 2)
    hosts = [local_host(cfg, local_fingerprint(nvml), {})]
    fresh = placement_over(cfg, hosts)
    assert fresh.evaluator is not None and fresh.evaluator.devices
    remember(tmp_path, hosts, fresh, resume=False, inputs={"same": 1})
    saved, _ = remember(tmp_path, hosts, fresh, resume=True, inputs={"same": 1})
    assert saved == fresh


def test_side_placement_leaves_the_trainer_and_generators_as_they_were() -> None:
    plain = _cfg()
    with_eval = _cfg("eval.every=5", "task.holdout=0.1")
    a, b = _place(plain, *["h100-sxm"] * 4), _place(with_eval, *["h100-sxm"] * 4)
    assert (a.trainer, a.generators) == (b.trainer, b.generators)
