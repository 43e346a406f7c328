"""Write the generated references under docs/reference/ from the code itself.

    python scripts/gen_reference.py           # write docs/reference/{settings,cli,trl}.md
    python scripts/gen_reference.py --check   # exit 1 naming each file that is not current

- settings.md: every setting of `RunConfig` and of the cluster file (`ClusterFile`), found by
  walking the pydantic models recursively: dotted name, type, default, range (from the Field
  constraints) and the field's docstring. A field without a docstring is an error, so a new
  setting cannot land undocumented.
- cli.md: every command, argument and option of the `grpo-stream` Typer app, read from the
  click objects Typer builds.
- trl.md: TRL's `GRPOConfig` names (trl 1.16.0) mapped to ours; each "ours" entry is checked
  to be a real setting, so a rename here fails the generator (and the test that runs it).

The wire protocol page (docs/reference/protocol.md) includes protocols/SPEC.md at build time
and is not written here. tests/test_docs.py runs `--check` and the strict build. The pages
are made by reference_settings.py, reference_cli.py and reference_trl.py beside this file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reference_cli import cli_page
from reference_settings import settings_page
from reference_trl import trl_page

from grpo_stream.cli.main import app
from grpo_stream.config.cluster import ClusterFile
from grpo_stream.config.run import RunConfig

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "reference"


def pages() -> dict[str, str]:
    """Each generated page's file name under docs/reference/ and its text."""
    return {
        "settings.md": settings_page(RunConfig, ClusterFile),
        "cli.md": cli_page(app),
        "trl.md": trl_page(RunConfig),
    }


def stale(out: Path = OUT) -> list[str]:
    """Generated pages whose committed text differs from what the code gives now."""
    return [
        name
        for name, text in pages().items()
        if not (out / name).exists() or (out / name).read_text(encoding="utf-8") != text
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say which pages are stale")
    args = parser.parse_args(argv)
    if args.check:
        names = stale()
        for name in names:
            print(f"docs/reference/{name} is not current: run python scripts/gen_reference.py")
        return 1 if names else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in pages().items():
        (OUT / name).write_text(text, encoding="utf-8")
        print(f"wrote docs/reference/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
