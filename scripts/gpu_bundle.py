"""Build the bundle that bench/gpu_check.sh installs on a bare GPU machine (no internet).

The bundle is one folder (default `.whl/`, which the device tool carries) holding, for the
GPU image's Python, a wheel of this tree's grpo-stream and manylinux wheels of everything
it needs that the GPU image (bench/gpu_image.txt) lacks, with `bundle.json` describing it.

    python scripts/gpu_bundle.py [--out .whl] [--python-version 3.12] [--glibc 2.28]
        [--image bench/gpu_image.txt] [--ignore-pin NAME ...] [--max-mib 60]

Steps, each with pip on this (CPU) machine:
1. a wheel of this tree: its tracked and untracked-not-ignored files copied to a clean
   folder first, so no stale build/ directory leaks old modules into it;
2. its requirements (no extras, markers read for the target) split into what the image
   has and what it lacks (plus the image's `+` names, carried anyway);
3. what it lacks resolved for the target by pip (a dry run: package metadata only), with
   the image's known versions as constraints, so what is carried agrees with them;
4. those wheels downloaded (binary only, no dependencies: the resolution named them all);
5. bundle.json: the target, each wheel (name, version, file, bytes, sha256) and the image's
   packages the resolution relies on (the rehearsal test builds its venv from them).
The folder must stay under --max-mib (a call to the GPU machine carries at most 64 MiB).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


class BundleError(RuntimeError):
    """The bundle cannot be built; the message says why in one line."""


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Image:
    """bench/gpu_image.txt: the image's Python and its packages (version where known)."""

    python: str
    pins: dict[str, str | None] = field(default_factory=dict)
    carried: set[str] = field(default_factory=set)

    def has(self, name: str) -> bool:
        key = canonical(name)
        return key in self.pins and key not in self.carried


def read_image(path: Path) -> Image:
    python = ""
    pins: dict[str, str | None] = {}
    carried: set[str] = set()
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("@python"):
            python = line.split()[1]
            continue
        carry = line.startswith("+")
        name, _, version = line.lstrip("+").partition("==")
        key = canonical(name.strip())
        pins[key] = version.strip() or None
        if carry:
            carried.add(key)
    if not python:
        raise BundleError(f"{path}: no `@python X.Y` line")
    return Image(python, pins, carried)


def target_args(python_version: str, glibc: str) -> list[str]:
    """pip's options for binary wheels of CPython `python_version` on x86-64 Linux with
    glibc `glibc` or older (manylinux tags are matched exactly: list each)."""
    major, minor = (int(p) for p in glibc.split("."))
    if major != 2 or minor < 17:
        raise BundleError(f"--glibc {glibc}: give 2.17 or newer")
    abi = "cp" + python_version.replace(".", "")
    tags = [f"manylinux_2_{m}_x86_64" for m in range(minor, 16, -1)]
    tags += ["manylinux2014_x86_64", "manylinux1_x86_64"]
    args = ["--only-binary=:all:", f"--python-version={python_version}"]
    args += ["--implementation=cp", f"--abi={abi}", "--abi=abi3", "--abi=none"]
    return args + [f"--platform={t}" for t in tags]


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
        raise BundleError(f"pip {args[0]} failed: {' / '.join(errors) or done.stderr[-500:]}")


def build_wheel(out: Path) -> Path:
    """A wheel of this tree, built from a clean copy of its files."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    with tempfile.TemporaryDirectory(prefix="gpu-bundle-src-") as tmp:
        src = Path(tmp)
        for rel in filter(None, listed):
            if (ROOT / rel).is_file():
                (src / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, src / rel)
        isolation = (
            [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
        )
        _pip("wheel", "-q", "--no-deps", *isolation, "-w", str(out), str(src))
    wheels = sorted(out.glob("grpo_stream-*.whl"))
    if not wheels:
        raise BundleError("pip wheel made no grpo_stream wheel")
    return wheels[-1]


def requirements(wheel: Path, python_version: str) -> list[Requirement]:
    """The wheel's Requires-Dist for the target (extras left out)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    env = {
        **default_environment(),
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "extra": "",
    }
    reqs = [
        Requirement(line.split(":", 1)[1].strip())
        for line in lines
        if line.startswith("Requires-Dist:")
    ]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(env)]


def wheel_name(path: Path) -> tuple[str, str]:
    """(canonical name, version) from a wheel's file name."""
    name, version = path.name.split("-")[:2]
    return canonical(name), version


def carried_closure(
    start: list[Requirement], image: Image, python_version: str, target: list[str], out: Path
) -> dict[str, Path]:
    """Download into `out` the newest wheel of each package that `start` needs and the
    image lacks, and of what those need in turn (the image's packages are taken as given:
    the check verifies them on the machine). A package required by several others gets the
    newest version every specifier admits, downloaded again if a later one excludes the
    first pick; the loop ends when nothing changes. Returns name -> wheel."""
    specs: dict[str, list[Requirement]] = {}
    got: dict[str, Path] = {}
    todo = list(start)
    for _ in range(20):
        for req in todo:
            specs.setdefault(canonical(req.name), []).append(req)
        stale = sorted(
            name
            for name, reqs in specs.items()
            if name not in got
            or not all(
                r.specifier.contains(wheel_name(got[name])[1], prereleases=True) for r in reqs
            )
        )
        if not stale:
            return got
        wanted = [
            name + ",".join(str(r.specifier) for r in specs[name] if r.specifier) for name in stale
        ]
        with tempfile.TemporaryDirectory(prefix="gpu-bundle-dl-") as tmp:
            _pip("download", "-q", "--no-deps", "-d", tmp, *target, *wanted)
            for wheel in Path(tmp).glob("*.whl"):
                name = wheel_name(wheel)[0]
                if name in got:
                    got[name].unlink()
                got[name] = Path(shutil.move(str(wheel), out / wheel.name))
        todo = [
            r
            for name in stale
            for r in requirements(got[name], python_version)
            if not image.has(r.name)
        ]
    raise BundleError(f"the requirements of {sorted(specs)} did not settle in 20 rounds")


def relied_on(wheels: list[Path], image: Image, python_version: str) -> dict[str, list[str]]:
    """Image packages the bundle's wheels require -> the specifiers they require; a known
    image version that a specifier excludes is an error (the check would fail there)."""
    out: dict[str, list[str]] = {}
    for wheel in wheels:
        for req in requirements(wheel, python_version):
            name = canonical(req.name)
            if not image.has(name):
                continue
            out.setdefault(name, [])
            if req.specifier:
                out[name].append(f"{wheel_name(wheel)[0]}: {req.specifier}")
            known = image.pins[name]
            if known and not req.specifier.contains(known, prereleases=True):
                raise BundleError(
                    f"{wheel.name} requires {req}, but the GPU image has {name} {known} "
                    "(bench/gpu_image.txt)"
                )
    return {name: sorted(set(v)) for name, v in sorted(out.items())}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(
    out: Path, image: Image, python_version: str, glibc: str, max_mib: float
) -> dict[str, Any]:
    """Build the bundle into `out` (emptied first); returns what bundle.json holds."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    target = target_args(python_version, glibc)
    ours = build_wheel(out)
    start = [r for r in requirements(ours, python_version) if not image.has(r.name)]
    start += [Requirement(name) for name in sorted(image.carried)]
    carried = carried_closure(start, image, python_version, target, out)
    wheels = sorted(out.glob("*.whl"))
    total = sum(w.stat().st_size for w in wheels)
    if total > max_mib * MIB:
        raise BundleError(f"the bundle is {total / MIB:.1f} MiB, over --max-mib {max_mib:g}")
    manifest: dict[str, Any] = {
        "python_version": python_version,
        "glibc": glibc,
        "wheels": [
            {"file": w.name, "bytes": w.stat().st_size, "sha256": _sha256(w)} for w in wheels
        ],
        "carried": sorted(f"{n}=={wheel_name(w)[1]}" for n, w in carried.items()),
        "image_relied_on": relied_on(wheels, image, python_version),
        "mib": round(total / MIB, 2),
    }
    (out / "bundle.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python scripts/gpu_bundle.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, default=ROOT / ".whl")
    p.add_argument("--image", type=Path, default=ROOT / "bench" / "gpu_image.txt")
    p.add_argument("--python-version", default=None, help="default: the image's (@python)")
    p.add_argument("--glibc", default="2.28", help="newest manylinux glibc the target has")
    p.add_argument("--max-mib", type=float, default=60.0)
    ns = p.parse_args(argv)
    try:
        image = read_image(ns.image)
        version = ns.python_version or image.python
        manifest = build(ns.out, image, version, ns.glibc, ns.max_mib)
    except BundleError as exc:
        print(f"gpu_bundle: {exc}", file=sys.stderr)
        return 1
    carried = ", ".join(manifest["carried"])
    print(f"{ns.out}: grpo-stream and {carried}: {manifest['mib']} MiB for Python {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
