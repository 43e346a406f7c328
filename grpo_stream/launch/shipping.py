"""What a service started on another host needs from the machine running `up`, besides its
command line: the run's secret, the hub's config, and the CURVE keys of its role.

A launcher that starts a service elsewhere (a Ray actor's arguments, a tar stream on the
stdin of ssh or srun) carries these files into RUN_DIR/private/INSTANCE on that host, and
the service's command line names them there. So nothing needs a shared filesystem or the
same file at the same path on every host, and no secret is ever on a command line.

Invariants: a shipment holds only what its role needs (`role_key_files`: the hub and the
trainer's weight server bind and get the server pair and the allow-list; every other role
only its own pair and the server's public key, plus the server pair when it binds too);
files are written with mode 0600 in a directory of mode 0700; a service started on the
machine running `up` ships nothing (it reads the files where they are).
"""

from __future__ import annotations

import io
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

from grpo_stream.launch.supervisor import ServiceSpec

PRIVATE = "private"
"""RUN_DIR/private/INSTANCE holds a service's shipped files on its host."""
SECRET_OPTION = "--secret-file"
KEYS_OPTION = "--keys-dir"
CONFIG_OPTION = "--config"


def role_key_files(service: str, serves: bool) -> list[str]:
    """The files of a `keys init` directory that `service` needs (`serves`: a generator
    that binds a relay or payload store, and so needs the server pair)."""
    server = ["server.key", "server.key_secret", "authorized"]
    if service == "grouper":
        return server
    own = [f"{service}.key", f"{service}.key_secret"]
    if service == "trainer" or (service == "generator" and serves):
        return [*server, *own]
    return ["server.key", *own]


@dataclass(frozen=True)
class Shipment:
    """Files to write below a service's private directory, and its command line naming them."""

    directory: str
    """Where the files go on the service's host (RUN_DIR/private/INSTANCE)."""
    files: dict[str, bytes]
    """Relative path -> content."""
    argv: list[str]

    def tar(self) -> bytes:
        """The files as a gzip tar stream (for a launcher's stdin)."""
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w:gz") as tar:
            for name, data in sorted(self.files.items()):
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o600
                tar.addfile(info, io.BytesIO(data))
        return out.getvalue()


def private_dir(run_dir: Path, instance: str) -> str:
    """RUN_DIR/private/INSTANCE: where a service's shipped files go on its host."""
    return str(Path(run_dir) / PRIVATE / instance)


def shipped_argv(spec: ServiceSpec, directory: str) -> list[str]:
    """`spec`'s command line naming its shipped files below `directory` on its host."""
    argv = list(spec.argv)
    for i, arg in enumerate(argv[:-1]):
        if arg == SECRET_OPTION:
            argv[i + 1] = f"{directory}/secret"
        elif arg == CONFIG_OPTION and spec.service == "grouper":
            argv[i + 1] = f"{directory}/config.toml"
        elif arg == KEYS_OPTION:
            argv[i + 1] = f"{directory}/keys"
    return argv


def shipment(spec: ServiceSpec, run_dir: Path, serves: bool = False) -> Shipment:
    """What `spec` reads from this machine (its --secret-file, --keys-dir and, for the hub,
    --config), with its command line rewritten to RUN_DIR/private/INSTANCE on its host."""
    directory = private_dir(run_dir, spec.instance)
    files: dict[str, bytes] = {}
    for i, arg in enumerate(spec.argv[:-1]):
        value = Path(spec.argv[i + 1])
        if arg == SECRET_OPTION:
            files["secret"] = value.read_bytes()
        elif arg == CONFIG_OPTION and spec.service == "grouper":
            files["config.toml"] = value.read_bytes()
        elif arg == KEYS_OPTION:
            names = role_key_files(spec.service, serves)
            own = value / f"{spec.service}.key_secret"
            if spec.service != "grouper" and not own.exists():  # keys from before roles
                names += ["client.key", "client.key_secret"]
            for name in names:
                for path in _files(value / name):
                    files[f"keys/{path.relative_to(value).as_posix()}"] = path.read_bytes()
    return Shipment(directory, files, shipped_argv(spec, directory))


@dataclass(frozen=True)
class Pending:
    """A shipment read when its service starts (each start: a restart reads the files
    again), for a launcher's stdin; `up --dry-run` and `plan` never read it."""

    spec: ServiceSpec
    run_dir: Path
    serves: bool

    def __call__(self) -> bytes:
        return shipment(self.spec, self.run_dir, self.serves).tar()


def _files(path: Path) -> list[Path]:
    """`path` itself, every file below it, or nothing when it does not exist."""
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file())
    return [path] if path.exists() else []


def unpack(files: dict[str, bytes], directory: Path) -> None:
    """Write `files` below `directory` (0700), each with mode 0600, replacing old ones."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    directory.chmod(0o700)
    for name, data in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, data)
        finally:
            os.close(fd)
