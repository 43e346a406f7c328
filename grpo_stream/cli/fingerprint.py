"""`grpo-stream fingerprint`: this host's devices and their performance score.

Imports pynvml, numpy and rich inside the command so `grpo-stream --help` stays fast.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import typer

from grpo_stream.cli.common import fail

if TYPE_CHECKING:
    from grpo_stream.hardware.device import DeviceFingerprint, HostFingerprint


def logs_to_stderr() -> None:
    """Keep stdout for the command's output (JSON must parse): log events go to stderr.

    Only the destination changes (processors and levels stay), so `capture_logs` and a
    service's own `setup_logging` are unaffected.
    """
    import sys

    import structlog

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.__stderr__))


def _fmt(device: DeviceFingerprint, key: str, value: Any, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "unknown"
    text = f"{value:,.{digits}f}" if isinstance(value, float) else str(value)
    prefix = "~" if key in device.estimated else ""
    return f"{prefix}{text}{unit}"


def _rows(d: DeviceFingerprint, score: float) -> list[tuple[str, str]]:
    link = None if d.pcie_generation is None else f"gen{d.pcie_generation} x{d.pcie_width}"
    nvlink = None if d.nvlink_links is None else f"{d.nvlink_active}/{d.nvlink_links} active"
    free = None if d.memory_free_bytes is None else d.memory_free_bytes / 2**30
    memory = f"{_fmt(d, '', d.memory_gib, ' GiB')} / {_fmt(d, '', free, ' GiB')}"
    units = f"{_fmt(d, 'sm_count', d.sm_count)} / {_fmt(d, 'cuda_cores', d.cuda_cores)}"
    clock = f"{_fmt(d, 'boost_sm_clock_mhz', d.boost_sm_clock_mhz)} / "
    clock += _fmt(d, "", d.max_sm_clock_mhz, " MHz")
    mem_clock = f"{_fmt(d, '', d.max_mem_clock_mhz, ' MHz')}, "
    mem_clock += _fmt(d, "", d.memory_bus_width_bits, " bit")
    pcie = _fmt(d, "pcie_gbps_per_direction", d.pcie_gbps_per_direction, " GB/s")
    return [
        ("kind", d.kind),
        ("memory total / free", memory),
        ("compute capability", _fmt(d, "", d.compute_capability)),
        ("architecture", _fmt(d, "", d.architecture)),
        ("SMs / CUDA cores", units),
        ("CPU cores", _fmt(d, "", d.cpu_cores)),
        ("SM clock boost / max", clock),
        ("memory clock, bus", mem_clock),
        ("memory bandwidth", _fmt(d, "memory_bandwidth_gbps", d.memory_bandwidth_gbps, " GB/s")),
        ("tensor (bf16 dense)", _fmt(d, "tensor_tflops", d.tensor_tflops, " TFLOPS")),
        ("FP32", _fmt(d, "fp32_tflops", d.fp32_tflops, " TFLOPS", 3)),
        ("PCIe", _fmt(d, "", link)),
        ("PCIe per direction", pcie),
        ("NVLink", _fmt(d, "", nvlink)),
        ("power limit", _fmt(d, "", d.power_limit_w, " W", 0)),
        ("HPM score", f"{score:.2f}"),
    ]


def _print_table(host: HostFingerprint, scores: dict[str, float]) -> None:
    from rich.console import Console
    from rich.table import Table

    source = host.source if host.nvml_error is None else f"cpu (NVML: {host.nvml_error})"
    table = Table(title=f"{host.hostname} — {source}", show_lines=False)
    table.add_column("")
    per_device = [_rows(d, scores[d.device_id]) for d in host.devices]
    for d in host.devices:
        table.add_column(f"{d.device_id}\n{d.name}")
    for i, (label, _) in enumerate(per_device[0]):
        table.add_row(label, *(rows[i][1] for rows in per_device))
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 140))  # piped: do not wrap at 80 columns
    console.print(table)
    console.print("~ estimated from NVML answers and datasheet tables; CPU numbers are measured.")


def fingerprint(
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    benchmark: bool = typer.Option(
        True, "--benchmark/--no-benchmark", help="Run the CPU micro-benchmarks (no GPU only)."
    ),
    recorded: str = typer.Option(
        None, "--recorded", help="Show a recorded device (e.g. h100-sxm) instead of this host."
    ),
    latency_ms: float = typer.Option(0.0, "--latency-ms", help="Hub round trip for the score."),
) -> None:
    """Print this host's devices (NVML GPUs, or the CPU) and their performance score."""
    from grpo_stream.hardware.device import HostFingerprint
    from grpo_stream.hardware.fingerprint import fingerprint_host
    from grpo_stream.hardware.recorded import load_recorded
    from grpo_stream.hardware.score import Features, ScoreModel

    logs_to_stderr()
    if recorded is not None:
        try:
            device = load_recorded(recorded, host="recorded")
        except KeyError as exc:
            fail(str(exc.args[0]))
        host = HostFingerprint(hostname="recorded", source="nvml", devices=[device])
    else:
        host = fingerprint_host(benchmark=benchmark)
    model = ScoreModel()
    scores = {d.device_id: model.score(Features.of(d, latency_ms / 1000)) for d in host.devices}
    if json_out:
        data = host.to_dict()
        for entry, d in zip(data["devices"], host.devices, strict=True):
            entry["score"] = scores[d.device_id]
        typer.echo(json.dumps(data, indent=2))
        return
    _print_table(host, scores)
