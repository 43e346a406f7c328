"""The built wheel installs into a fresh virtual environment, maps services/ and protocols/
into the grpo_stream namespace, ships its data files, and its CLI runs."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

from grpo_stream.models.loading import SHIPPED_MODELS

ROOT = Path(__file__).resolve().parents[2]


def source_modules() -> list[str]:
    """Every module of the source tree, as the wheel should hold it (package-dir mapped)."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    out = []
    for package, folder in setuptools["package-dir"].items():
        for path in (ROOT / folder).rglob("*.py"):
            out.append("/".join([*package.split("."), *path.relative_to(ROOT / folder).parts]))
    return out


def test_wheel_installs_and_imports_in_a_fresh_venv(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(dist),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = dist.glob("grpo_stream-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "grpo_stream/services/grouper.py" in names
    assert "grpo_stream/protocols/SPEC.md" in names
    for asset in SHIPPED_MODELS.values():  # every shipped model's weights and build info
        assert f"grpo_stream/assets/{asset}/model.safetensors" in names
        assert f"grpo_stream/assets/{asset}/build_info.json" in names
    for page in ("index.html", "dashboard.js", "dashboard.css"):  # the dashboard's page
        assert f"grpo_stream/dashboard/static/{page}" in names
    assert not any(n.startswith(("services/", "protocols/")) for n in names)
    missing = [m for m in source_modules() if m not in names]
    assert missing == [], "modules left out of the wheel: add their package to pyproject.toml"

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    # the dependencies come from this environment (no downloads): its site directories, also
    # one reached through a .pth file (a worktree's venv over a shared one); the project from
    # the wheel only (a .pth file in a directory named by deps.pth is not run: no editable finder)
    sites = [p for p in sys.path if p.endswith("site-packages")]
    (
        Path(
            subprocess.check_output(
                [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
            ).strip()
        )
        / "deps.pth"
    ).write_text("\n".join(sites) + "\n")
    subprocess.run(
        [py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    out = subprocess.run(
        [
            py,
            "-c",
            "import grpo_stream.services.grouper, grpo_stream.protocols.codec as c, grpo_stream; "
            "print(grpo_stream.__file__, c.PROTO_VERSION)",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert str(env_dir) in out.stdout
    cli = subprocess.run(
        [env_dir / "bin" / "grpo-stream", "--help"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert cli.returncode == 0 and "up" in cli.stdout
