"""The trainer's device and precision settings resolved against the host, CUDA replaced
at its boundary (the CudaProbe record), and the one-line errors before services start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import CTRLConfig

from grpo_stream.config import ConfigError, RunConfig, load_config
from grpo_stream.training.device import (
    CudaProbe,
    checkpointing_supported,
    resolve_device,
    resolve_precision,
    trainer_preflight,
)

H100 = CudaProbe(True, device_count=2, bf16=True)
T4 = CudaProbe(True, device_count=1, bf16=False)  # compute capability 7.5: no bfloat16
NO_CUDA = CudaProbe(False)


def test_auto_is_the_local_ranks_gpu_when_cuda_is_visible() -> None:
    assert resolve_device("auto", H100, local_rank=1) == "cuda:1"
    assert resolve_device("cuda", H100, local_rank=0) == "cuda:0"


def test_auto_is_the_cpu_without_cuda_and_cpu_stays_cpu() -> None:
    assert resolve_device("auto", NO_CUDA, local_rank=0) == "cpu"
    assert resolve_device("cpu", H100, local_rank=0) == "cpu"


def test_cuda_without_cuda_names_the_setting() -> None:
    with pytest.raises(ConfigError, match=r'trainer\.device = "cuda"'):
        resolve_device("cuda", NO_CUDA, local_rank=0)


def test_a_rank_without_a_gpu_of_its_own_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"rank 2 has no GPU"):
        resolve_device("auto", H100, local_rank=2)


def test_auto_precision_is_bf16_mixed_on_gpus_and_fp32_on_the_cpu() -> None:
    assert resolve_precision("auto", "cuda:0", H100) == "bf16-mixed"
    assert resolve_precision("auto", "cuda:0", T4) == "fp16-mixed"
    assert resolve_precision("auto", "cpu", NO_CUDA) == "fp32"
    assert resolve_precision("bf16-mixed", "cpu", NO_CUDA) == "bf16-mixed"  # CPU autocast


def test_bf16_mixed_on_a_gpu_without_bf16_names_the_setting() -> None:
    with pytest.raises(ConfigError, match=r'trainer\.precision = "bf16-mixed"'):
        resolve_precision("bf16-mixed", "cuda:0", T4)


def _cfg(tmp_path: Path, *overrides: str) -> RunConfig:
    return load_config(None, [f"run.run_dir={json.dumps(str(tmp_path))}", *overrides])


def test_preflight_of_the_default_run_asks_cuda_nothing(tmp_path: Path) -> None:
    def probe() -> CudaProbe:
        raise AssertionError("the default run must not probe CUDA")

    trainer_preflight(_cfg(tmp_path), probe)


def test_preflight_rejects_cuda_on_a_host_without_it(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, 'trainer.device="cuda"')
    with pytest.raises(ConfigError, match=r"trainer\.device"):
        trainer_preflight(cfg, lambda: NO_CUDA)


def test_preflight_rejects_bf16_mixed_on_an_old_gpu(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, 'trainer.precision="bf16-mixed"')
    with pytest.raises(ConfigError, match=r"trainer\.precision"):
        trainer_preflight(cfg, lambda: T4)


def test_checkpointing_support_is_read_from_the_models_config(tmp_path: Path) -> None:
    CTRLConfig(vocab_size=32, n_embd=16, n_layer=1, n_head=2, dff=32).save_pretrained(tmp_path)
    assert checkpointing_supported("grpo-stream/tiny-arith")
    assert not checkpointing_supported(str(tmp_path))
    cfg = _cfg(
        tmp_path,
        "trainer.gradient_checkpointing=true",
        f"model.name_or_path={json.dumps(str(tmp_path))}",
    )
    with pytest.raises(ConfigError, match=r"trainer\.gradient_checkpointing"):
        trainer_preflight(cfg, lambda: NO_CUDA)


def test_micro_batch_tokens_below_the_longest_sequence_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"trainer\.micro_batch_tokens"):
        _cfg(tmp_path, "trainer.micro_batch_tokens=64", "generator.max_tokens=64")


class _FakeCuda:
    """torch.cuda at its boundary: counts empty_cache calls."""

    def __init__(self) -> None:
        self.emptied = 0

    def empty_cache(self) -> None:
        self.emptied += 1


def test_a_colocated_trainer_on_a_gpu_releases_its_cache() -> None:
    from grpo_stream.training.device import release_cache

    cuda = _FakeCuda()
    assert release_cache("cuda:0", colocated=True, cuda=cuda)
    assert cuda.emptied == 1


@pytest.mark.parametrize(("device", "colocated"), [("cuda:0", False), ("cpu", True)])
def test_the_cache_is_kept_unless_colocated_on_a_gpu(device: str, colocated: bool) -> None:
    from grpo_stream.training.device import release_cache

    cuda = _FakeCuda()
    assert not release_cache(device, colocated=colocated, cuda=cuda)
    assert cuda.emptied == 0
