"""The send journal: records survive a reopen; a record torn by a crash is left out."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from grpo_stream.hub.journal import SendJournal, Sent
from grpo_stream.protocols import messages as m
from grpo_stream.protocols.make_golden import step_stats_example


def batch(step: int) -> m.TrainBatch:
    return m.TrainBatch(
        step=step,
        group_ids=np.array([3, 4], np.int64),
        input_ids=np.array([1, 2, 3], np.int32),
        seq_offsets=np.array([0, 3], np.int64),
        prompt_lens=np.array([1], np.int32),
        behaviour_logprobs=np.array([-0.5, -0.25], np.float32),
        advantages=np.array([1.0], np.float32),
        rewards=np.array([1.0], np.float32),
        versions=np.array([0], np.int32),
        group_offsets=np.array([0, 1], np.int64),
        totals=m.BatchTotals(num_seqs=1, num_tokens=2),
        sampling=m.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=8),
        stats=step_stats_example(),
    )


def record(seq: int) -> Sent:
    req = m.BatchRequest(step=seq, trainer_version=seq)
    return Sent.of(seq, req, [3, 4], [True, False], [batch(seq)])


def test_records_read_back_with_their_batches(tmp_path: Path) -> None:
    journal = SendJournal(tmp_path / "j")
    journal.append(record(1))
    journal.append(record(2))
    got = SendJournal(tmp_path / "j").read()
    assert [r.seq for r in got] == [1, 2]
    assert got[1].shard(0) == batch(2) and got[1].first_uses() == [3]


def test_a_torn_last_record_is_left_out(tmp_path: Path) -> None:
    journal = SendJournal(tmp_path / "j")
    journal.append(record(1))
    journal.append(record(2))
    data = (tmp_path / "j").read_bytes()
    (tmp_path / "j").write_bytes(data[:-5])  # the crash hit mid-append
    assert [r.seq for r in journal.read()] == [1]


def test_reset_empties_the_journal(tmp_path: Path) -> None:
    journal = SendJournal(tmp_path / "j")
    journal.append(record(1))
    journal.reset()
    assert journal.read() == []
