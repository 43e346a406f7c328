"""scripts/first_day.py reads the commands a new user types from the pages that show them:
the README's two, then getting-started's next steps, which run in order in one checkout."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))  # scripts/ is no package
import first_day  # noqa: E402


def test_the_readme_gives_the_lean_install_then_the_tests_with_dev() -> None:
    install, tests = first_day.commands(ROOT / "README.md", "## Set-up: two commands", 2)
    assert "pip install -e . && grpo-stream up" in install
    assert 'pip install -e ".[dev]" && python -m pytest' in tests


def test_each_new_run_of_the_next_steps_has_its_own_run_directory() -> None:
    steps = first_day.commands(ROOT / "docs" / "getting-started.md", "## Next steps", 1)
    assert steps and all(c.startswith("grpo-stream ") for c in steps)
    new_runs = [first_day.run_dir_of(c) for c in steps if "--resume" not in c]
    new_runs = [d for d in new_runs if d is not None]
    assert len(new_runs) == len(set(new_runs)) and Path("runs/default") not in new_runs
