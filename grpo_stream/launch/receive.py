"""The receiving end of a shipment on another host: `python -m grpo_stream.launch.receive DIR
-- COMMAND...` reads a gzip tar of a service's private files from stdin (what `up` writes
into ssh's or srun's stdin, grpo_stream.launch.shipping), writes them below DIR on this
host (DIR mode 0700, files mode 0600), then execs COMMAND, which names them there.

So a service started through ssh or srun gets the run's secret, its role's CURVE keys and
(the hub) the config without a shared filesystem and without any of it on a command line.
Only regular files with relative names inside DIR are accepted; anything else ends this
with one line and exit code 2 before the service starts.
"""

from __future__ import annotations

import io
import os
import sys
import tarfile
from pathlib import Path, PurePosixPath

from grpo_stream.launch.shipping import unpack

USAGE = "usage: python -m grpo_stream.launch.receive DIR -- COMMAND..."
MAX_BYTES = 64 * 1024 * 1024
"""More than any secret, key set and config; a larger stdin is not a shipment."""


class ShipmentError(ValueError):
    """The bytes on stdin are not a shipment; the message is one line."""


def read_files(data: bytes) -> dict[str, bytes]:
    """The files of a shipment's tar stream, by relative path."""
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar:
                name = PurePosixPath(member.name)
                if not member.isfile() or name.is_absolute() or ".." in name.parts:
                    raise ShipmentError(f"refusing {member.name!r}: not a plain relative file")
                body = tar.extractfile(member)
                files[name.as_posix()] = body.read() if body is not None else b""
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ShipmentError(f"stdin is not a shipment (a gzip tar): {exc}") from None
    return files


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print(USAGE, file=sys.stderr)
        return 2
    directory, command = Path(argv[0]), argv[2:]
    data = sys.stdin.buffer.read(MAX_BYTES + 1)
    try:
        if len(data) > MAX_BYTES:
            raise ShipmentError(f"stdin holds more than {MAX_BYTES} bytes")
        unpack(read_files(data), directory)
    except (ShipmentError, OSError) as exc:
        print(f"grpo-stream receive {directory}: {exc}", file=sys.stderr)
        return 2
    null = os.open(os.devnull, os.O_RDONLY)  # the service's stdin: not the launcher's pipe
    os.dup2(null, 0)
    os.close(null)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"grpo-stream receive: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
