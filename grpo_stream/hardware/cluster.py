"""The devices of a cluster file's hosts (`grpo_stream.config.cluster`), fingerprinted:
recordings by name, this machine's own for "auto". A device that is not recorded raises
ClusterError with one line naming the field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from grpo_stream.config.cluster import ClusterError, ClusterFile, ClusterHost, read_cluster_file
from grpo_stream.hardware.device import DeviceFingerprint
from grpo_stream.hardware.fingerprint import fingerprint_host
from grpo_stream.hardware.recorded import load_recorded


@dataclass(frozen=True)
class Cluster:
    """A resolved cluster file: fingerprints and what plan_roles needs besides."""

    spec: ClusterFile
    devices: list[DeviceFingerprint]
    latency_s: dict[str, float]


def host_devices(
    host: ClusterHost, position: int, live: Callable[[], list[DeviceFingerprint]] | None = None
) -> list[DeviceFingerprint]:
    """The devices of one host entry: recordings by name, this machine's for "auto" (`live`
    reads them; default: every device `fingerprint_host` finds, benchmarked)."""
    out: list[DeviceFingerprint] = []
    for slot, name in enumerate(host.devices):
        if name == "auto":
            found = live() if live else fingerprint_host(benchmark=True).devices
            first = len(out)  # not len(out) inside the loop: it grows as devices are added
            out += [
                dataclasses.replace(d, host=host.name, index=first + i) for i, d in enumerate(found)
            ]
            continue
        try:
            out.append(load_recorded(name, host=host.name, index=len(out)))
        except KeyError as exc:
            raise ClusterError(f"hosts.{position}.devices.{slot}: {exc.args[0]}") from None
    return out


def load_cluster(path: Path) -> Cluster:
    """Read a cluster file and fingerprint its devices (recordings, or this machine for auto)."""
    spec = read_cluster_file(path)
    devices: list[DeviceFingerprint] = []
    latency: dict[str, float] = {}
    for position, host in enumerate(spec.hosts):
        for device in host_devices(host, position):
            devices.append(device)
            latency[device.device_id] = host.latency_ms / 1000
    return Cluster(spec=spec, devices=devices, latency_s=latency)
