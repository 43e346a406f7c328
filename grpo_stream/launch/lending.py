"""Cores lent between the torch services of one machine while one of them waits.

With `run.torch_threads = "auto"` and `run.lend_cores` (the default), when `up` gives each
torch service it starts on its machine one thread, unpinned (as many torch services as
cores, or more: a trainer and a generator on 2 cores), a waiting service's core would idle:
the generator's while the trainer trains, between its batches. So `up` gives each a byte of a
board (a file in the run directory, `board_file`, made by the first service that opens it:
1 while that service computes, 0 while it waits; a dead service's last byte stays). A
computing service follows the board at points a few milliseconds apart (the trainer at each
decoder layer, forward and backward; a generator at each decoding step): its torch threads
are its own one plus one per waiting service. A service waits only inside `waiting()` (the
trainer while it asks for its next batch; a generator while it waits for prompts or for the
trainer's weights): anything else counts as computing, so a path that never says it waits
never lends. The trainer thus computes on both cores while the generator waits, and gives
the core back within a layer of the generator starting.

Invariants:
- a service never runs fewer threads than its own one, and a computing service counts only
  waiting services' cores, so computing services hold at most the cores they were given
  plus the waiting ones', up to one follow interval after a service starts computing;
- every byte starts at 1 (computing): no core is lent before its owner says it waits;
- without a board (lend_cores off, pinned or multi-thread plans, several trainer ranks, a
  service started by hand) every call here does nothing.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_BOARD = "GRPO_STREAM_BOARD"
"""`PATH:SLOT:SLOTS`: the board file, this service's byte in it and the board's size."""

COMPUTING, WAITING = 1, 0


@dataclass
class Board:
    """One service's view of its machine's board."""

    memory: mmap.mmap
    slot: int
    threads: int = 1  # what this service's torch runs now

    def mark(self, state: int) -> None:
        self.memory[self.slot] = state

    def lent(self) -> int:
        """Waiting services other than this one: the cores lent to it."""
        return sum(1 for i in range(len(self.memory)) if i != self.slot and not self.memory[i])

    def follow(self) -> None:
        """Set this service's torch threads to its own plus the lent cores, if they changed."""
        want = 1 + self.lent()
        if want != self.threads:
            import torch

            torch.set_num_threads(want)
            self.threads = want


_board: Board | None = None


def board_file(run_dir: Path, slots: int) -> Path:
    """The run's board of `slots` services (named by its size: a resumed run with other
    services gets a board of its own, not the last one's)."""
    return run_dir / f"cores-{slots}.board"


def board_env(run_dir: Path, slot: int, slots: int) -> dict[str, str]:
    """The environment that gives one of `slots` services its byte of the run's board."""
    return {ENV_BOARD: f"{board_file(run_dir, slots)}:{slot}:{slots}"}


def _open(path: Path, slots: int) -> mmap.mmap:
    """The board at `path`, made (every byte computing) by whichever service comes first:
    written whole to a temporary file, then linked into place, so none maps a part."""
    if not path.exists():
        tmp = path.with_name(f"{path.name}.{os.getpid()}")
        tmp.write_bytes(bytes([COMPUTING]) * slots)
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
        tmp.unlink()
    with open(path, "r+b") as f:
        memory = mmap.mmap(f.fileno(), 0)
    if (held := len(memory)) != slots:
        memory.close()
        raise ValueError(f"{ENV_BOARD}: {path} holds {held} services, not {slots}")
    return memory


def join(environ: Mapping[str, str]) -> bool:
    """Open this service's board from its environment (at start-up, after its threads are
    set); it computes until it says it waits. False when it has none."""
    global _board
    spec = environ.get(ENV_BOARD, "")
    if not spec:
        return False
    path, slot, slots = spec.rsplit(":", 2)
    if not 0 <= int(slot) < int(slots):
        raise ValueError(f"{ENV_BOARD}={spec}: slot {slot} outside the board's {slots}")
    _board = Board(_open(Path(path), int(slots)), int(slot))
    _board.mark(COMPUTING)
    return True


def leave() -> None:
    """Close the board (tests; a service process simply ends)."""
    global _board
    if _board is not None:
        _board.mark(COMPUTING)  # lends nothing any more
        _board.memory.close()
    _board = None


def active() -> bool:
    return _board is not None


def follow() -> None:
    """Take the cores lent now (or give them back): call at points of the work a few
    milliseconds apart."""
    if _board is not None:
        _board.follow()


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """Lend this service's core while the block runs (it waits); compute again after."""
    if _board is None:
        yield
        return
    _board.mark(WAITING)
    try:
        yield
    finally:
        _board.mark(COMPUTING)
        _board.follow()


def follow_layers(model: Any) -> int:
    """Follow the board at each repeated block of `model` (the items of its ModuleLists: the
    decoder layers), before its forward and, in training, when backward reaches its input;
    the number of blocks hooked (0 without a board)."""
    import torch

    if _board is None:
        return 0

    def on_grad(grad: torch.Tensor) -> None:
        follow()

    def before(module: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        follow()
        hidden = args[0] if args else kwargs.get("hidden_states")
        if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
            hidden.register_hook(on_grad)  # type: ignore[no-untyped-call]

    hooked = 0
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList):
            for block in module:
                block.register_forward_pre_hook(before, with_kwargs=True)
                hooked += 1
    return hooked


def lends(plans: Sequence[Any], processes: Sequence[int]) -> bool:
    """Whether a machine's torch services lend cores: two or more, one process each (no
    trainer ranks), every plan one thread and unpinned."""
    return (
        len(plans) >= 2
        and all(n == 1 for n in processes)
        and all(p.threads == 1 and not p.cpus for p in plans)
    )
