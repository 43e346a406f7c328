"""The NVML reader: every question asked, failures recorded as unknown, never raised."""

from __future__ import annotations

import sys

import pynvml
import pytest

from grpo_stream.hardware.nvml import QUESTIONS, NvmlUnavailable, read_device, read_nvml
from grpo_stream.hardware.recorded import RecordedNvml


def test_reader_answers_every_question_for_every_device(fake_nvml):
    raw = read_nvml(fake_nvml("h100-sxm", "l4"))
    assert len(raw["devices"]) == 2
    for device in raw["devices"]:
        assert set(device["answers"]) == set(QUESTIONS)


def test_reader_returns_the_recorded_answers(fake_nvml, record):
    raw = read_nvml(fake_nvml("h100-sxm"))["devices"][0]
    assert raw == {"answers": record("h100-sxm")["answers"], "errors": record("h100-sxm")["errors"]}


def test_not_supported_answers_are_none_with_the_error_name(fake_nvml):
    raw = read_nvml(fake_nvml("t4"))["devices"][0]
    assert raw["answers"]["num_gpu_cores"] is None
    assert raw["answers"]["nvlink_states"] is None
    assert raw["errors"]["num_gpu_cores"] == "NVMLError_NotSupported"
    assert raw["errors"]["nvlink_states"] == "NVMLError_NotSupported"


def test_a_device_that_answers_nothing_never_raises(record):
    silent = record("l4")
    silent["answers"] = {key: None for key in silent["answers"]}
    silent["errors"] = {key: "NVMLError_NotSupported" for key in silent["answers"]}
    silent["errors"]["uuid"] = "NVMLError_NoPermission"
    nvml = RecordedNvml([silent])
    raw = read_device(nvml, nvml.nvmlDeviceGetHandleByIndex(0))
    assert all(value is None for value in raw["answers"].values())
    assert raw["errors"]["uuid"] == "NVMLError_NoPermission"


def test_nvlink_states_stop_after_the_last_link(fake_nvml):
    raw = read_nvml(fake_nvml("h100-sxm", "a100-40gb-sxm"))
    assert [len(d["answers"]["nvlink_states"]) for d in raw["devices"]] == [18, 12]


def test_missing_driver_raises_nvml_unavailable_with_the_reason(fake_nvml):
    with pytest.raises(NvmlUnavailable) as info:
        read_nvml(fake_nvml("l4", init_error="NVMLError_DriverNotLoaded"))
    assert info.value.error == "NVMLError_DriverNotLoaded"


def test_reader_shuts_nvml_down_after_reading(fake_nvml):
    nvml = fake_nvml("l4")
    read_nvml(nvml)
    assert not nvml.initialised


def test_reader_imports_pynvml_by_default(monkeypatch, fake_nvml):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml("rtx-4090"))
    raw = read_nvml()
    assert raw["devices"][0]["answers"]["name"] == "NVIDIA GeForce RTX 4090"


def test_recorded_errors_are_pynvml_error_classes(fake_nvml):
    nvml = fake_nvml("l4")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetNvLinkState(0, 0)
