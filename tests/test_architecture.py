"""docs/architecture.md's floor plan is the code's: every room of the package is on it, and
every import runs down its floors, never sideways or up (tests/importgraph.py reads the
imports from the source: module level, under TYPE_CHECKING and inside functions alike).

A room is a sub-package of `grpo_stream` (its modules and sub-packages together), or a
module of `grpo_stream/` on its own; `grpo_stream.services` and `grpo_stream.protocols`
are rooms like the others.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from importgraph import GRAPH, MODULES, ROOT

PLAN = ROOT / "docs" / "architecture.md"
ROW = re.compile(r"^\| (\d+) \| `([\w/]+)` \| .+ \|$")


def floor_plan() -> dict[str, int]:
    """Room name (as written: `hub/` for a package, `logs` for a module) -> floor."""
    text = PLAN.read_text()
    section = text[text.index("### The floor plan") :]
    section = section[: section.index("\n## ")]
    rooms: dict[str, int] = {}
    for line in section.splitlines():
        found = ROW.match(line)
        if found:
            name = found.group(2)
            assert name not in rooms, f"{name} is on the floor plan twice"
            rooms[name] = int(found.group(1))
    return rooms


def room_of(module: str) -> str:
    """The room a module of the package stands in."""
    parts = module.split(".")
    if len(parts) < 2:
        return ""  # grpo_stream/__init__.py: the package's face, in no room
    path = MODULES[".".join(parts[:2])]
    return f"{parts[1]}/" if path.name == "__init__.py" else parts[1]


PLANNED = floor_plan()


def test_the_plan_reads_as_a_table_of_floors() -> None:
    assert (
        len(PLANNED) > 20 and PLANNED["config/"] == 1 and PLANNED["cli/"] == max(PLANNED.values())
    )


def test_every_room_of_the_code_is_on_the_plan_and_no_other() -> None:
    code = {room_of(m) for m in MODULES} - {""}
    assert sorted(code - PLANNED.keys()) == [], "rooms missing from docs/architecture.md"
    assert sorted(PLANNED.keys() - code) == [], "rooms on the plan that the code lacks"


def test_every_import_runs_down_the_floors() -> None:
    wrong = []
    for module, edges in GRAPH.items():
        here = room_of(module)
        for edge in edges:
            there = room_of(edge.target) if edge.target in MODULES else ""
            if not here or not there or there == here:
                continue
            if PLANNED[there] >= PLANNED[here]:
                wrong.append(
                    f"{MODULES[module].relative_to(ROOT)}:{edge.line} ({here}, floor "
                    f"{PLANNED[here]}) imports {edge.target} ({there}, floor {PLANNED[there]})"
                )
    assert wrong == []
