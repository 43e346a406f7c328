"""The CPU micro-benchmarks measured once per host boot and shared by every process on it.

A CPU fingerprint is a property of the host, but its micro-benchmarks vary by tens of percent
with what else runs at that moment: two generators started together on one host, each
measuring on its own, report different devices for the same silicon, and the score model
(HPM = alpha*F + beta*B - gamma*L) cannot absorb that noise. So the first process that needs
the figures measures them under an exclusive file lock and writes them to a cache file; every
later process on the same boot reads them (waiting on the lock while a measurement is under
way, so two processes starting together measure once).

Invariants: the cache is keyed by the boot id, CPU model, usable cores and benchmark length,
so a reboot, another CPU set or another benchmark length measures again; a missing,
unreadable or foreign cache file is never an error: it is measured again and rewritten
atomically (temp file + rename), so a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

from grpo_stream.hardware.cpu import CpuRates, cpu_cores, cpu_model, measure

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def default_cache_path() -> Path:
    """$XDG_CACHE_HOME/grpo-stream/cpu-bench.json (XDG_CACHE_HOME defaults to ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "grpo-stream" / "cpu-bench.json"


def _key(seconds: float) -> str:
    try:
        boot = BOOT_ID.read_text().strip()
    except OSError:  # no /proc (macOS, some containers): the key holds without it
        boot = "no-boot-id"
    return f"{boot}|{cpu_model()}|{cpu_cores()}|{seconds:g}"


def _read(path: Path, key: str) -> CpuRates | None:
    try:
        data = json.loads(path.read_text())
        if data["key"] != key:
            return None
        return CpuRates(float(data["gflops_per_core"]), float(data["copy_gbps"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(path: Path, key: str, rates: CpuRates) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    body = {"key": key, "gflops_per_core": rates.gflops_per_core, "copy_gbps": rates.copy_gbps}
    tmp.write_text(json.dumps(body))
    tmp.replace(path)


def host_rates(seconds: float, path: Path | None = None) -> CpuRates:
    """This boot's cached rates, measuring (once, under the lock) when there are none."""
    path = path or default_cache_path()
    key = _key(seconds)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = (path.parent / f"{path.name}.lock").open("a")
    except OSError:  # an unwritable cache directory: measure for this process only
        return measure(seconds)
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or by the kernel
        cached = _read(path, key)
        if cached is not None:
            return cached
        rates = measure(seconds)
        with contextlib.suppress(OSError):  # read-only cache: the figures still serve us
            _write(path, key, rates)
        return rates
