"""A user's first day, timed: the README's two commands and getting-started's next steps, in a
fresh clone, as a user would type them.

    python scripts/first_day.py                  # all of it
    python scripts/first_day.py --skip-tests     # the install, the default run, the next steps
    python scripts/first_day.py --keep DIR       # work in DIR (kept) instead of a temp dir

It clones this repository's checked-out commit, reads the commands from README.md ("Set-up:
two commands": the first two bash blocks) and docs/getting-started.md ("Next steps"), runs each
with `bash -c` in the clone (the first one makes .venv; the others run in it), and prints one
row per command: exit status, seconds, and for `up` how the run ended (RUN_DIR/outcome.json)
and its reward over the first and last 20 steps. It fails (exit 1) at the first command that
fails. The environment is this one's, less any active virtual environment, so nothing of the
caller's install leaks into the clone's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = (
    ("README.md", "## Set-up: two commands", 2),
    ("docs/getting-started.md", "## Next steps", 1),
)
"""(page, heading, bash blocks to take after it)."""


@dataclass(frozen=True)
class Row:
    command: str
    code: int
    seconds: float
    note: str


def commands(page: Path, heading: str, blocks: int) -> list[str]:
    """The command lines of the first `blocks` bash blocks after `heading` (comments cut)."""
    text = page.read_text(encoding="utf-8")
    after = text[text.index(heading) :]
    found = re.findall(r"```bash\n(.*?)```", after, re.DOTALL)[:blocks]
    lines = [line.split(" #", 1)[0].strip() for block in found for line in block.splitlines()]
    return [line for line in lines if line]


def clean_env() -> dict[str, str]:
    """This environment without an active virtual environment."""
    env = dict(os.environ)
    venv = env.pop("VIRTUAL_ENV", None)
    if venv:
        parts = env.get("PATH", "").split(os.pathsep)
        env["PATH"] = os.pathsep.join(p for p in parts if not p.startswith(venv))
    env.pop("PYTHONPATH", None)
    return env


def run_dir_of(command: str) -> Path | None:
    """The run directory an `up` command writes (None for other commands)."""
    words = shlex.split(command)
    if "grpo-stream" not in words or "up" not in words:
        return None
    return (
        Path(words[words.index("--run-dir") + 1]) if "--run-dir" in words else Path("runs/default")
    )


def outcome(clone: Path, run_dir: Path) -> str:
    """How an `up` ended and its reward, first 20 steps against the last 20."""
    try:
        ended = json.loads((clone / run_dir / "outcome.json").read_text())["ended"]
        rows = [json.loads(line) for line in (clone / run_dir / "metrics.jsonl").open()]
    except (OSError, ValueError, KeyError):
        return "no outcome.json"
    rewards = [float(r["reward_mean"]) for r in rows]
    head, tail = rewards[:20], rewards[-20:]
    return (
        f"{ended} at step {rows[-1]['step']}, reward {sum(head) / len(head):.2f} -> "
        f"{sum(tail) / len(tail):.2f}"
        if rows
        else ended
    )


def run(command: str, clone: Path, env: dict[str, str], timeout_s: float) -> Row:
    """One command as a user types it (the venv the first command made, active after it)."""
    activate = ". .venv/bin/activate && " if (clone / ".venv").is_dir() else ""
    start = time.monotonic()
    try:
        code = subprocess.run(
            ["bash", "-c", activate + command], cwd=clone, env=env, timeout=timeout_s
        ).returncode
    except subprocess.TimeoutExpired:
        code = 124
    seconds = time.monotonic() - start
    where = run_dir_of(command)
    return Row(command, code, seconds, "" if where is None else outcome(clone, where))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-tests", action="store_true", help="Skip the test command.")
    parser.add_argument("--keep", type=Path, help="Work in this directory and keep it.")
    parser.add_argument("--timeout", type=float, default=3600, help="Seconds per command.")
    args = parser.parse_args(argv)
    work = args.keep or Path(tempfile.mkdtemp(prefix="first-day-"))
    clone = work / "grpo-stream"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    todo = [c for page, heading, n in SECTIONS for c in commands(ROOT / page, heading, n)]
    if args.skip_tests:
        todo = [c for c in todo if "pytest" not in c]
    env = clean_env()
    rows: list[Row] = []
    for command in todo:
        print(f"$ {command}", flush=True)
        rows.append(run(command, clone, env, args.timeout))
        if rows[-1].code != 0:
            break
    print(f"\nfresh clone of {ROOT} in {clone}; load at the end {os.getloadavg()[0]:.2f}")
    for row in rows:
        print(f"{row.code:>4} {row.seconds:8.1f} s  {row.command}  {row.note}".rstrip())
    return 0 if rows and all(r.code == 0 for r in rows) and len(rows) == len(todo) else 1


if __name__ == "__main__":
    sys.exit(main())
