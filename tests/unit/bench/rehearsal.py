"""The GPU image rehearsed on this CPU machine, for the rehearsals of bench/gpu_check.sh and
bench/gpu_scale.sh (tests/unit/bench/conftest.py builds it once per session).

The bundle is built by scripts/gpu_bundle.py for this machine's Python (the target Python is
a parameter); the venv holds only the GPU image's packages (CPU builds of the same names)
plus, at run time, the bundle. The venv is made without copying what this environment
already unpacked: its packages are hard-linked from here (torch 2.13.0+cpu stands in for the
image's CUDA build of 2.11.0, numpy as installed here for 2.5.2, which needs Python >= 3.12),
except those whose version the image list pins, which pip installs at that version
(transformers 5.17.0, huggingface-hub 1.33.0, ...). Needs PyPI (pip).
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[3]
STAND_INS = {"torch", "numpy"}  # linked from here whatever the image's version (see above)


def _bundler() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_bundle", REPO / "scripts" / "gpu_bundle.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_bundle"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gpu_bundle = _bundler()


def _link(site: Path, dist: metadata.Distribution) -> None:
    """Hard-link an installed distribution's files (those inside site-packages) into `site`."""
    for file in dist.files or []:
        source = Path(str(dist.locate_file(file)))
        if ".." in file.parts or not source.is_file():
            continue
        target = site / file
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(source, target)


def _requires(dist: metadata.Distribution) -> list[str]:
    from packaging.requirements import Requirement

    out = []
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            out.append(req.name)
    return out


def image_venv(venv: Path, needed: list[str], bundled: set[str]) -> tuple[list[str], list[str]]:
    """A venv holding `needed` and what they require that the GPU image has: pinned ones
    installed by pip at the image's version, the rest linked from this environment. What
    the bundle carries (`bundled`) is left to the bundle, as on the GPU machine (typer 0.29
    here requires pydantic); what an image package requires that the image list lacks is
    left out, as it is there (pandas here requires tzdata). Returns (the canonical names the
    venv holds, "X (required by Y)" of those left out)."""
    image = gpu_bundle.read_image(REPO / "bench" / "gpu_image.txt")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = venv / "lib" / version / "site-packages"
    _link(site, metadata.distribution("pip"))
    held: dict[str, metadata.Distribution] = {}
    lacking: set[str] = set()
    done = set(bundled)  # names settled without a distribution in the venv
    todo = [(name, "the bundle") for name in [*needed, "pip"]]
    while todo:
        pinned = []
        for name, parent in todo:
            key = gpu_bundle.canonical(name)
            if key in held or key in done:
                continue
            if key not in image.pins:
                assert parent != "the bundle", f"the bundle relies on {name}: not in the image"
                lacking.add(f"{key} (required by {parent})")
                done.add(key)
                continue
            if image.pins[key] and key not in STAND_INS:
                pinned.append(f"{key}=={image.pins[key]}")
                continue
            dist = metadata.distribution(name)
            if key != "pip":
                _link(site, dist)
            held[key] = dist
        if pinned:
            pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
            subprocess.run([*pip, "install", "-q", "--no-deps", *pinned], check=True)
        installed = {
            gpu_bundle.canonical(d.metadata["Name"]): d
            for d in metadata.distributions(path=[str(site)])
        }
        held.update({k: installed[k] for k in (p.split("==")[0] for p in pinned)})
        todo = [
            (r, key)
            for key in list(held)
            for r in _requires(held[key])
            if gpu_bundle.canonical(r) not in held and gpu_bundle.canonical(r) not in done
        ]
    names = sorted(
        gpu_bundle.canonical(d.metadata["Name"]) for d in metadata.distributions(path=[str(site)])
    )
    return names, sorted(lacking)


@dataclass
class Image:
    """The rehearsed GPU image: the bundle, a venv of the image's packages, what it holds."""

    root: Path
    bundle: Path
    venv: Path
    manifest: dict[str, Any]
    held: list[str]
    lacking: list[str]


def build_image(root: Path) -> Image:
    """The bundle for this machine's Python and the image's venv, under `root`."""
    bundle = root / "bundle"
    glibc = platform.libc_ver()[1] or "2.28"
    build = [
        sys.executable,
        str(REPO / "scripts" / "gpu_bundle.py"),
        "--out",
        str(bundle),
        "--python-version",
        f"{sys.version_info.major}.{sys.version_info.minor}",
        "--glibc",
        ".".join(glibc.split(".")[:2]),
    ]
    t0 = time.perf_counter()
    built = subprocess.run(build, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    manifest = json.loads((bundle / "bundle.json").read_text())
    bundled = {c.split("==")[0] for c in manifest["carried"]}
    t1 = time.perf_counter()
    held, lacking = image_venv(root / "venv", list(manifest["image_relied_on"]), bundled)
    print(f"rehearsed image: bundle {t1 - t0:.0f} s, venv {time.perf_counter() - t1:.0f} s")
    return Image(root, bundle, root / "venv", manifest, held, lacking)


def run_script(
    script: Path, image: Image, work: Path, *args: str, env_work: str = "GPU_CHECK_WORK"
) -> subprocess.CompletedProcess[str]:
    """`bash SCRIPT --cpu --bundle ... ARGS` in the image's venv, its work folder `work`."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "OUT")}
    env.update({"PYTHON": str(image.venv / "bin" / "python"), env_work: str(work)})
    env.update(OUT=str(work / "out"), PATH=f"{image.venv / 'bin'}:{env['PATH']}")
    cmd = ["bash", str(script), "--cpu", "--bundle", str(image.bundle), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env, cwd=work)
