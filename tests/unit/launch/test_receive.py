"""The receiving end of a shipment: `up` writes a service's files into ssh's or srun's stdin,
`python -m grpo_stream.launch.receive DIR -- COMMAND` unpacks them privately and runs COMMAND.

Each case runs the real module in a child process, with the tar stream on its stdin."""

from __future__ import annotations

import io
import stat
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from grpo_stream.launch.shipping import shipment
from grpo_stream.launch.supervisor import ServiceSpec

RECEIVE = [sys.executable, "-m", "grpo_stream.launch.receive"]
SECRET = "ef" * 32


@dataclass
class Received:
    returncode: int
    stdout: str
    stderr: str


def _receive(directory: Path, stdin: bytes, *command: str) -> Received:
    out = subprocess.run([*RECEIVE, str(directory), "--", *command], input=stdin,
                         capture_output=True, timeout=60)  # fmt: skip
    return Received(out.returncode, out.stdout.decode(), out.stderr.decode())


def _tar(members: dict[str, bytes], kind: bytes = tarfile.REGTYPE) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.type = len(data), kind
            if kind == tarfile.SYMTYPE:
                info.size, info.linkname = 0, "/etc/passwd"
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return out.getvalue()


def test_files_land_privately_and_the_command_reads_them_with_stdin_closed(
    tmp_path: Path,
) -> None:
    (tmp_path / "secret").write_text(SECRET)
    spec = ServiceSpec("scorer-0", "scorer", ["python", "--secret-file", str(tmp_path / "secret")])
    ship = shipment(spec, tmp_path / "remote")
    read = (f"import sys; print(open({ship.argv[-1]!r}).read()); "
            "print(repr(sys.stdin.read()))")  # fmt: skip
    out = _receive(Path(ship.directory), ship.tar(), sys.executable, "-c", read)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [SECRET, "''"]  # the secret, then an empty stdin
    private = Path(ship.directory)
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert stat.S_IMODE((private / "secret").stat().st_mode) == 0o600


def test_a_name_outside_the_directory_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    out = _receive(tmp_path / "in", _tar({"../escaped": b"x"}), "touch", str(marker))
    assert out.returncode == 2
    assert "refusing '../escaped'" in out.stderr and len(out.stderr.splitlines()) == 1
    assert not marker.exists() and not (tmp_path / "escaped").exists()


def test_a_link_is_refused(tmp_path: Path) -> None:
    out = _receive(tmp_path / "in", _tar({"secret": b""}, tarfile.SYMTYPE), "true")
    assert out.returncode == 2 and "not a plain relative file" in out.stderr


def test_stdin_that_is_not_a_shipment_is_one_line(tmp_path: Path) -> None:
    out = _receive(tmp_path / "in", b"hello", "true")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "not a shipment" in out.stderr


def test_a_missing_command_is_one_line(tmp_path: Path) -> None:
    out = _receive(tmp_path / "in", _tar({"secret": b"x"}), str(tmp_path / "nope"))
    assert out.returncode == 127 and "cannot run" in out.stderr
