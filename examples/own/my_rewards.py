"""The reward of examples/own.toml: a user reward function, imported by path.

The scorer's reward workers import `my_rewards` by name (`import = "my_rewards:near"`), so
this directory must be on their Python path: start `up` with
`PYTHONPATH=examples/own grpo-stream up --config examples/own.toml`.
"""

from __future__ import annotations

import re
from typing import Any

NUMBER = re.compile(r"-?\d+")


def near(completion: str, *, prompt: str, reference: dict[str, Any], tolerance: int = 0) -> float:
    """1.0 when the completion's first number is within `tolerance` of the answer, 0.5 when it
    is within twice that, else 0.0 (no number: 0.0)."""
    found = NUMBER.search(completion)
    if found is None:
        return 0.0
    miss = abs(int(found.group()) - int(reference["answer"]))
    if miss <= tolerance:
        return 1.0
    return 0.5 if miss <= 2 * tolerance else 0.0
