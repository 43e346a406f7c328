"""The steps of bench/gpu_check.sh that inspect the host (run through bench/gpu_check.py,
which loads this file by its path), each returning its JSON result with "ok":

- `requirements`: grpo_stream is imported from the bundle installed into `--site`, the
  bundle is for this Python, every requirement of grpo-stream (recursively) is met by what
  is installed, and CUDA is available (unless `--cpu`). An unmet requirement of grpo-stream,
  or of a package installed from the bundle, fails the step; one between the image's own
  packages is only reported (`image_notes`).
- `nvml`: GPU 0's raw NVML record; `fingerprint`: `grpo-stream fingerprint --json`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

NVML_NOTE = (
    "Captured by bench/gpu_check.sh on the lent machine through nvidia-ml-py (the live "
    "reader, grpo_stream.hardware.nvml.read_device), {date}; driver {driver}."
)


# ----- requirements ---------------------------------------------------------------------
def _unmet(root: str, site: Path) -> tuple[list[str], list[str], dict[str, str]]:
    """Walk the requirements of `root` and of every distribution they reach (extras left
    out): (unmet requirements of grpo-stream or of a package installed from the bundle into
    `site`, which fail the check; unmet requirements between the image's own packages,
    reported only: the image's business, e.g. its pandas without tzdata; the versions seen)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    problems: list[str] = []
    notes: list[str] = []
    seen: dict[str, str] = {}
    todo = [canonicalize_name(root)]
    while todo:
        name = todo.pop()  # canonical (PEP 503), as the messages name it
        dist = metadata.distribution(name)
        where = Path(str(dist.locate_file(""))).resolve()  # the folder holding its dist-info
        ours = name == root or where == site or site in where.parents
        unmet = problems if ours else notes
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            key = canonicalize_name(req.name)
            try:
                version = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                unmet.append(f"{name} needs {req}: not installed")
                continue
            if req.specifier and not req.specifier.contains(version, prereleases=True):
                unmet.append(f"{name} needs {req}: {version} is installed")
            if key not in seen:
                seen[key] = version
                todo.append(key)
    return problems, notes, seen


def requirements(ns: argparse.Namespace) -> dict[str, Any]:
    import grpo_stream

    problems: list[str] = []
    where = Path(grpo_stream.__file__).resolve()
    site = Path(ns.site).resolve()
    if site not in where.parents:
        problems.append(f"grpo_stream imported from {where}, not from the bundle in {site}")
    manifest = json.loads((Path(ns.bundle) / "bundle.json").read_text())
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    if manifest["python_version"] != running:
        problems.append(f"the bundle is for Python {manifest['python_version']}, this is {running}")
    unmet, notes, versions = _unmet("grpo-stream", site)
    problems += unmet
    import torch

    cuda = torch.cuda.is_available()
    if not ns.cpu and not cuda:
        problems.append("torch.cuda.is_available() is false")
    return {
        "ok": not problems,
        "problems": problems,
        "image_notes": notes,
        "grpo_stream": str(where),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": cuda,
        "device": torch.cuda.get_device_name(0) if cuda else None,
        "versions": versions,
    }


# ----- the device: NVML's raw record and the fingerprint --------------------------------
def nvml(ns: argparse.Namespace) -> dict[str, Any]:
    """GPU 0's raw NVML record, in the shape of grpo_stream/hardware/recorded/*.json."""
    from grpo_stream.hardware.nvml import NvmlUnavailable, read_nvml

    try:
        raw = read_nvml()
    except NvmlUnavailable as exc:
        return {"ok": ns.cpu, "skipped" if ns.cpu else "error": str(exc)}
    if not raw["devices"]:
        return {"ok": ns.cpu, "error": "NVML lists no device"}
    note = NVML_NOTE.format(date=time.strftime("%Y-%m-%d"), driver=raw["driver_version"])
    return {"ok": True, "record": {"note": note, **raw["devices"][0]}}


def fingerprint(ns: argparse.Namespace) -> dict[str, Any]:
    """`grpo-stream fingerprint --json` of the installed package, its whole stdout parsed."""
    cmd = [sys.executable, "-m", "grpo_stream.cli.main", "fingerprint", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=ns.timeout)
    if done.returncode != 0:
        return {"ok": False, "rc": done.returncode, "stderr": done.stderr[-2000:]}
    host = json.loads(done.stdout)
    gpus = [d for d in host["devices"] if d["kind"] == "gpu"]
    ok = ns.cpu or bool(gpus)
    device = (gpus or host["devices"] or [{}])[0]
    return {"ok": ok, "source": host["source"], "device": device, "devices": len(host["devices"])}
