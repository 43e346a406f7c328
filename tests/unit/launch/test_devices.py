"""What a service reports of its devices, and the model size placement reads."""

from __future__ import annotations

from grpo_stream.config import load_config
from grpo_stream.hardware.fingerprint import fingerprint_host
from grpo_stream.hardware.recorded import RecordedNvml, load_record
from grpo_stream.launch.devices import assigned, model_params


def _host(*names: str):
    return fingerprint_host(benchmark=False, nvml=RecordedNvml([load_record(n) for n in names]))


def test_a_service_reports_only_the_gpus_cuda_visible_devices_gives_it_in_that_order() -> None:
    host = _host("l4", "h100-sxm", "t4")
    mine = assigned(host, {"CUDA_VISIBLE_DEVICES": "2,1"})
    assert [(d.index, d.name) for d in mine.devices] == [
        (2, "Tesla T4"),
        (1, "NVIDIA H100 80GB HBM3"),
    ]


def test_cuda_visible_devices_by_uuid_selects_that_gpu() -> None:
    host = _host("l4", "h100-sxm")
    mine = assigned(host, {"CUDA_VISIBLE_DEVICES": host.devices[1].uuid or ""})
    assert [d.index for d in mine.devices] == [1]


def test_the_tiny_model_size_is_read_from_its_safetensors_header() -> None:
    from safetensors.torch import load_file

    from grpo_stream.models.loading import resolve_model

    cfg = load_config(None, [])
    tensors = load_file(f"{resolve_model(cfg.model.name_or_path)}/model.safetensors")
    assert model_params(cfg) == sum(t.numel() for t in tensors.values())
