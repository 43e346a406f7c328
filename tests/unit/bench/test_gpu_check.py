"""bench/gpu_check.sh, bench/gpu_check.py and scripts/gpu_bundle.py.

The fast tests: the image list, the bundle's target tags, the summary (a failed step fails
the check after the table), the fingerprint step parsing the CLI's indented JSON.

The CPU rehearsal (slow): the bundle built by the same script for this machine's Python
(the target Python is a parameter), a venv holding only the GPU image's packages (CPU
builds of the same names) plus the bundle, and `gpu_check.sh --cpu` run end to end: exit 0
with the JSON; with a wheel left out of the bundle, the requirements step fails and the
check exits non-zero after printing the table. The venv is made without copying what this
environment already unpacked: its packages are hard-linked from here (torch 2.13.0+cpu
stands in for the image's CUDA build of 2.11.0, numpy as installed here for 2.5.2, which
needs Python >= 3.12), except those whose version the image list pins, which pip installs
at that version (transformers 5.17.0, huggingface-hub 1.33.0, ...). Needs PyPI (pip).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
CHECK = REPO / "bench" / "gpu_check.sh"
PARTS = REPO / "bench" / "gpu_check.py"
STAND_INS = {"torch", "numpy"}  # linked from here whatever the image's version (see above)


sys.path.insert(0, str(Path(__file__).parent))
from rehearsal import Image, gpu_bundle, run_script  # noqa: E402


def test_the_image_list_says_what_the_gpu_machine_has_and_lacks() -> None:
    image = gpu_bundle.read_image(REPO / "bench" / "gpu_image.txt")
    assert image.python == "3.12"
    assert image.pins["torch"] == "2.11.0" and image.pins["transformers"] == "5.17.0"
    for present in ("numpy", "msgpack", "typer", "rich", "psutil", "nvidia-ml-py", "peft"):
        assert image.has(present), present
    for absent in ("pyzmq", "structlog", "pydantic", "zstandard", "math-verify", "datasets"):
        assert not image.has(absent), absent
    assert not image.has("typing_extensions")  # in the image, carried anyway


def test_the_bundle_asks_pip_for_the_targets_wheels_only() -> None:
    args = gpu_bundle.target_args("3.12", "2.28")
    assert "--only-binary=:all:" in args and "--abi=cp312" in args
    assert "--platform=manylinux_2_28_x86_64" in args and "--platform=manylinux_2_17_x86_64" in args
    assert "--platform=manylinux_2_29_x86_64" not in args
    with pytest.raises(gpu_bundle.BundleError, match=r"--glibc 2\.5"):
        gpu_bundle.target_args("3.12", "2.5")


def _summary(work: Path, out: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-P", str(PARTS), "summary", "--work", str(work), "--out", str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_a_failed_step_fails_the_summary_after_the_table(tmp_path: Path) -> None:
    (tmp_path / "rc.txt").write_text("install 0\nrequirements 0\ntrainer 1\npublish 0\n")
    (tmp_path / "requirements.json").write_text(json.dumps({"ok": True, "torch": "2.11.0"}))
    (tmp_path / "trainer.json").write_text(json.dumps({"ok": False}))
    (tmp_path / "trainer.log").write_text("Traceback: out of memory\n")
    (tmp_path / "publish.json").write_text("{not json")
    done = _summary(tmp_path, tmp_path / "out")
    assert done.returncode == 1
    assert "| step install | ok |" in done.stdout and "| step trainer | FAILED |" in done.stdout
    assert done.stdout.splitlines()[-1].startswith("gpu_check: FAILED: trainer, publish")
    data = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert data["failed"] == ["trainer", "publish"]
    assert "out of memory" in data["trainer"]["log_tail"]


def test_every_step_passing_passes_the_summary(tmp_path: Path) -> None:
    (tmp_path / "rc.txt").write_text("install 0\nnvml 0\n")
    record = {"note": "n", "answers": {"name": "NVIDIA H200"}, "errors": {}}
    (tmp_path / "nvml.json").write_text(json.dumps({"ok": True, "record": record}))
    done = _summary(tmp_path, tmp_path / "out")
    assert done.returncode == 0, done.stdout
    assert json.loads((tmp_path / "out" / "nvml_record.json").read_text()) == record


def _part(part: str, out: Path, *args: str) -> tuple[int, dict[str, Any]]:
    cmd = [sys.executable, "-P", str(PARTS), part, "--json-out", str(out), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=out.parent)
    return done.returncode, json.loads(out.read_text())


def test_the_fingerprint_step_reads_the_clis_whole_json(tmp_path: Path) -> None:
    rc, result = _part("fingerprint", tmp_path / "fp.json", "--cpu")
    assert rc == 0 and result["ok"] and result["source"] == "cpu"
    assert result["device"]["kind"] == "cpu" and result["device"]["name"]
    rc, on_gpu = _part("fingerprint", tmp_path / "fp-gpu.json")  # a GPU is required
    assert rc == 1 and not on_gpu["ok"]


# ----- the CPU rehearsal ------------------------------------------------------------------
@pytest.fixture(scope="module")
def rehearsal(gpu_image: Image) -> dict[str, Any]:
    work = gpu_image.root / "check-work"
    work.mkdir()
    t0 = time.perf_counter()
    done = run_script(CHECK, gpu_image, work)
    print(f"rehearsal: check {time.perf_counter() - t0:.0f} s")
    print("".join(line for line in done.stderr.splitlines(keepends=True) if "rc=" in line))
    return {
        "root": gpu_image.root,
        "work": work,
        "bundle": gpu_image.bundle,
        "manifest": gpu_image.manifest,
        "held": gpu_image.held,
        "lacking": gpu_image.lacking,
        "done": done,
        "image": gpu_image,
    }


@pytest.mark.slow  # builds a bundle (pip, PyPI) and runs every step on the CPU: minutes
@pytest.mark.timeout(900)
def test_the_bundle_carries_what_the_image_lacks_within_the_size_limit(
    rehearsal: dict[str, Any],
) -> None:
    manifest = rehearsal["manifest"]
    carried = {c.split("==")[0] for c in manifest["carried"]}
    assert {
        "pyzmq",
        "structlog",
        "pydantic",
        "pydantic-core",
        "zstandard",
        "math-verify",
    } <= carried
    assert any(w["file"].startswith("grpo_stream-") for w in manifest["wheels"])
    assert manifest["mib"] <= 60


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_rehearsal_venv_holds_only_the_gpu_images_packages(rehearsal: dict[str, Any]) -> None:
    # left out: what this environment's newer image packages require beyond the image list
    print("left out of the rehearsal venv:", rehearsal["lacking"])
    image = gpu_bundle.read_image(REPO / "bench" / "gpu_image.txt")
    assert all(name in image.pins for name in rehearsal["held"])
    for absent in ("grpo-stream", "pyzmq", "structlog", "pydantic", "zstandard", "math-verify"):
        assert absent not in rehearsal["held"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_gpu_check_cpu_passes_end_to_end_on_the_installed_package(
    rehearsal: dict[str, Any],
) -> None:
    done, work = rehearsal["done"], rehearsal["work"]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "| step up | ok |" in done.stdout
    data = json.loads((work / "out" / "gpu_check.json").read_text())
    assert data["failed"] == []
    assert Path(data["requirements"]["grpo_stream"]).is_relative_to(work / "site")
    assert data["requirements"]["versions"]["transformers"] == "5.17.0"  # the image's
    assert data["fingerprint"]["source"] == "cpu" and data["nvml"]["skipped"]
    for precision in ("fp32", "bf16-mixed", "bf16"):
        assert data["trainer"][precision]["tokens_per_s"] > 0
    assert data["up"]["steps"] == 3 and data["generate"]["completions"] > 0
    assert (work / "out" / "gpu_check.log").exists()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_wheel_missing_from_the_bundle_fails_the_check_after_the_table(
    rehearsal: dict[str, Any],
) -> None:
    root = rehearsal["root"]
    broken = root / "broken-bundle"
    shutil.copytree(rehearsal["bundle"], broken)
    for wheel in broken.glob("antlr4_python3_runtime-*.whl"):  # latex2sympy2-extended needs it
        wheel.unlink()
    (root / "broken").mkdir()
    image = dataclasses.replace(rehearsal["image"], bundle=broken)
    done = run_script(CHECK, image, root / "broken", "--only", "install,requirements")
    assert done.returncode == 1
    assert "| step requirements | FAILED |" in done.stdout
    data = json.loads((root / "broken" / "out" / "gpu_check.json").read_text())
    assert data["failed"] == ["requirements"]
    # a carried package's own requirement (not grpo-stream's) is checked too
    assert any(
        p.startswith("latex2sympy2-extended needs antlr4-python3-runtime")
        and p.endswith("not installed")
        for p in data["requirements"]["problems"]
    ), data["requirements"]
