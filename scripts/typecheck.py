"""mypy --strict over the package as it installs, read from pyproject.toml's `package-dir`.

`services/` and `protocols/` install as `grpo_stream.services` and `grpo_stream.protocols`
(no generic top-level import names); mypy names a module after its path, so each file is
handed to it with the module name the wheel gives it. Extra arguments go to mypy.
Exit status: mypy's (0 clean, 1 errors, 2 usage).
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from mypy import build
from mypy.errors import CompileError
from mypy.main import process_options
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parents[1]


def sources() -> list[BuildSource]:
    """Every module of the wheel, with the name it installs under."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    out = []
    for package, folder in setuptools["package-dir"].items():
        base = ROOT / folder
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out.append(BuildSource(str(path), ".".join([package, *parts])))
    return out


def main(argv: list[str]) -> int:
    # the options of pyproject.toml's [tool.mypy]; the program text is a placeholder for the
    # sources, which are the wheel's modules below
    config = str(ROOT / "pyproject.toml")
    _, options = process_options(["--config-file", config, "--strict", *argv, "-c", "pass"])
    try:
        result = build.build(sources(), options)
    except CompileError as exc:
        print("\n".join(exc.messages))
        return 2
    for line in result.errors:
        print(line)
    print(f"Found {len(result.errors)} errors" if result.errors else "Success: no issues found")
    return 1 if result.errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
