"""Cores lent while a service waits: the board between real processes, the threads it gives,
the hooks in a model's layers, and which plans `up` gives a board."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_stream.config import load_config
from grpo_stream.launch import lending, placed, threads
from grpo_stream.launch.placement import Placement, Slot
from grpo_stream.launch.supervisor import ServiceSpec
from grpo_stream.launch.threads import size_specs
from grpo_stream.models import testing


@pytest.fixture(autouse=True)
def _no_board() -> Any:
    torch.set_num_threads(1)
    yield
    lending.leave()
    torch.set_num_threads(1)


def env(run_dir: Path, slot: int, slots: int = 2) -> dict[str, str]:
    return lending.board_env(run_dir, slot, slots)


def test_without_a_board_nothing_happens() -> None:
    assert not lending.join({})
    assert not lending.active()
    with lending.waiting():
        lending.follow()
    assert torch.get_num_threads() == 1
    assert lending.follow_layers(testing.tiny_qwen2(16, 0, layers=2)) == 0


GENERATOR = """
import os, sys
from grpo_stream.launch import lending
lending.join(os.environ)
with lending.waiting():
    print("waiting", flush=True)
    sys.stdin.readline()
print("computing", flush=True)
sys.stdin.readline()
with lending.waiting():
    print("waiting", flush=True)
    sys.stdin.readline()
"""


def test_a_waiting_process_lends_its_core_and_takes_it_back(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", GENERATOR],
        env={**os.environ, **env(tmp_path, 1)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        assert lending.join(env(tmp_path, 0))  # the trainer: computing
        assert child.stdout.readline().strip() == "waiting"
        lending.follow()
        assert torch.get_num_threads() == 2  # its own and the waiting generator's
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "computing"
        lending.follow()
        assert torch.get_num_threads() == 1  # given back
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "waiting"
        lending.follow()
        assert torch.get_num_threads() == 2
        with lending.waiting():  # the trainer waits too: it lends, and takes on leaving
            assert lending.board_file(tmp_path, 2).read_bytes() == bytes([0, 0])
        assert lending.board_file(tmp_path, 2).read_bytes() == bytes([1, 0])
    finally:
        child.stdin.write("\n")
        child.stdin.flush()
        child.wait(timeout=30)


def test_the_board_starts_with_every_service_computing(tmp_path: Path) -> None:
    assert lending.join(env(tmp_path, 0, slots=3))
    assert lending.board_file(tmp_path, 3).read_bytes() == bytes([1, 1, 1])
    lending.follow()
    assert torch.get_num_threads() == 1  # nobody said it waits: nothing is lent


def test_a_slot_outside_the_board_or_a_board_of_another_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=lending.ENV_BOARD):
        lending.join(env(tmp_path, 2, slots=2))
    lending.board_file(tmp_path, 2).write_bytes(bytes([1, 1, 1]))
    with pytest.raises(ValueError, match="holds 3 services, not 2"):
        lending.join(env(tmp_path, 0, slots=2))


def test_a_model_follows_the_board_at_each_layer_forward_and_backward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = testing.tiny_qwen2(16, 0, layers=3, train=True)
    assert lending.join(env(tmp_path, 0))
    assert lending.follow_layers(model) == 3  # the decoder layers
    calls: list[float] = []
    monkeypatch.setattr(lending, "follow", lambda: calls.append(time.perf_counter()))
    out = model(input_ids=torch.tensor([[1, 2, 3, 4]]))
    assert len(calls) == 3  # before each layer's forward
    out.logits.sum().backward()
    assert len(calls) == 6  # and when backward reaches each layer's input
    with torch.no_grad():
        model(input_ids=torch.tensor([[1, 2, 3]]))
    assert len(calls) == 9  # no backward hooks without grad


def test_up_gives_a_board_to_one_thread_unpinned_services(tmp_path: Path) -> None:
    trainer = ServiceSpec("trainer-0", "trainer", ["t"])
    generator = ServiceSpec("generator-0", "generator", ["g"])
    scorer = ServiceSpec("scorer-0", "scorer", ["s"])
    size_specs("auto", [(trainer, 1), (generator, 1), (scorer, 1)], cores=[0, 1], board=tmp_path)
    assert trainer.env[lending.ENV_BOARD] == f"{lending.board_file(tmp_path, 2)}:0:2"
    assert generator.env[lending.ENV_BOARD] == f"{lending.board_file(tmp_path, 2)}:1:2"
    assert lending.ENV_BOARD not in scorer.env


@pytest.mark.parametrize(
    ("cores", "ranks", "board"),
    [
        ([0, 1, 2, 3], 1, True),  # two threads each, pinned: no board
        ([0, 1], 2, True),  # trainer ranks: no board
        ([0, 1], 1, False),  # run.lend_cores = false
    ],
)
def test_no_board_for_pinned_plans_ranks_or_lend_cores_off(
    tmp_path: Path, cores: list[int], ranks: int, board: bool
) -> None:
    trainer = ServiceSpec("trainer-0", "trainer", ["t"])
    generator = ServiceSpec("generator-0", "generator", ["g"])
    size_specs("auto", [(trainer, ranks), (generator, 1)], cores=cores,
               board=tmp_path if board else None)  # fmt: skip
    assert lending.ENV_BOARD not in trainer.env and lending.ENV_BOARD not in generator.env


def test_lend_cores_reaches_the_specs_up_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(threads, "local_cores", lambda: [0, 1])
    placement = Placement("none", (Slot("local"),), (Slot("local"),))
    for lend, expected in (("true", True), ("false", False)):
        cfg = load_config(None, [f'run.run_dir="{tmp_path}"', 'run.torch_threads="auto"',
                                 f"run.lend_cores={lend}"])  # fmt: skip
        specs = {s.service: s for s in placed.placed_specs(cfg, placement, "tcp://h:1", False)}
        assert (lending.ENV_BOARD in specs["trainer"].env) is expected
        assert (lending.ENV_BOARD in specs["generator"].env) is expected
