"""A batch that crashes the trainer is never served again as is. With the hub's content checks
off (`security.check_content = false`: the hub takes what a simulated fleet says), a
generator with the run's secret gets a token id of 10**6 into a batch; the trainer refuses it
(`BatchRefused`, one line) and exits, `up` restarts it, the hub resends the same batch
(exactly-once), the trainer dies again, and then the hub serves that step new groups. The
run completes; the poisoned groups end failed, never trained."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo_stream.protocols import messages as m
from grpo_stream.protocols.codec import decode

from .conftest import Run, assert_accounting, hub_events, trainer_consumed
from .trust_peers import Rogue, frames, out_of_vocabulary

pytestmark = pytest.mark.slow
STEPS = 12
SETTINGS = ["--set", "security.check_content=false", "--set", "trainer.checkpoint_every=1",
            "--set", "security.batch_crash_limit=2"]  # fmt: skip


def oov_with_signal(rogue: Rogue, batch: m.PromptBatch, i: int) -> list[bytes]:
    """A token id of 10**6, and texts of which one is right: the group carries a learning
    signal, so it is trained (not filtered)."""
    ro = decode(out_of_vocabulary(rogue, batch, i))
    assert isinstance(ro, m.Rollout)
    answer = str(rogue.task.problem(ro.group_id).reference.get("answer", "1"))
    ro.texts = [answer] + ["x"] * (len(ro.texts) - 1)
    return frames(ro)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Run, Rogue, int]]:
    run = Run(tmp_path_factory.mktemp("poisoned") / "run", STEPS, *SETTINGS)
    rogue: Rogue | None = None
    try:
        run.wait_steps(1)  # `up` has written the run's secret by then
        rogue = Rogue(run.run_dir, [("out_of_vocabulary", oov_with_signal)])
        rogue.join()
        player = threading.Thread(target=rogue.play, args=(1,),
                                  kwargs={"timeout_s": 60, "replies": False})  # fmt: skip
        player.start()  # no reply comes: the hub takes it unchecked
        code = run.finish(timeout=420)
        player.join()
        yield run, rogue, code
    finally:
        if rogue is not None:
            rogue.close()
        run.kill()


def test_the_run_completes(finished: tuple[Run, Rogue, int]) -> None:
    run, _, code = finished
    assert code == 0, Path(run.log.name).read_text()[-3000:]
    assert_accounting(run.run_dir, STEPS)


def test_the_trainer_refused_the_batch_twice_then_got_new_groups(
    finished: tuple[Run, Rogue, int],
) -> None:
    run, rogue, _ = finished
    assert rogue.sent == ["out_of_vocabulary"] and rogue.replies == []  # taken unchecked
    (poisoned,) = hub_events(run.run_dir, "batch.poisoned")
    assert poisoned["level"] == "error" and poisoned["deaths"] == 2
    out = Path(run.log.name).read_text()
    assert out.count("BatchRefused") >= 2 and "outside the vocabulary" in out
    trained = {g for groups in trainer_consumed(run.run_dir).values() for g in groups}
    assert not set(poisoned["groups"]) & trained  # none of that batch was trained
    counters = json.loads((run.run_dir / "hub" / "counters.json").read_text())
    assert counters["failed"] >= len(poisoned["groups"])
