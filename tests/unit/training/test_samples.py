"""run.log_completions: what the trainer trained, decoded, in completions.jsonl and the sinks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from grpo_stream.hub.batches import build_batch
from grpo_stream.hub.replay import Group
from grpo_stream.models.loading import load_tokenizer
from grpo_stream.protocols.messages import SamplingParams
from grpo_stream.training.samples import CompletionLog, batch_samples, read_samples
from grpo_stream.training.sinks import make_sinks

TOKENIZER = load_tokenizer("grpo-stream/tiny-arith")


def _group(group_id: int, prompt: str, completions: list[str], rewards: list[float]) -> Group:
    ids = [TOKENIZER.encode(c, add_special_tokens=False) for c in completions]
    offsets = np.cumsum([0] + [len(x) for x in ids])
    r = np.array(rewards, np.float32)
    return Group(
        group_id=group_id,
        policy_version=group_id,
        prompt_ids=np.array(TOKENIZER.encode(prompt, add_special_tokens=False), np.int32),
        completion_ids=np.array([t for x in ids for t in x], np.int32),
        completion_offsets=offsets.astype(np.int64),
        logprobs=np.zeros(int(offsets[-1]), np.float32),
        rewards=r,
        advantages=(r - r.mean()).astype(np.float32),
        valid=np.ones(len(completions), bool),
        sampling=SamplingParams(temperature=1.0, top_p=1.0, max_tokens=8),
    )


GROUPS = [
    _group(0, "1+1=", ["2", "3"], [1.0, 0.0]),
    _group(1, "2+3=", ["5", "5", "6"], [1.0, 1.0, 0.0]),
    _group(2, "4+4=", ["8", "9"], [1.0, 0.0]),
]


def test_the_first_prompts_completions_are_decoded_with_their_rewards() -> None:
    samples = batch_samples(build_batch(7, GROUPS), TOKENIZER, step=7, prompts=2)
    assert [(s.prompt, s.completion, s.reward, s.version) for s in samples] == [
        ("1+1=", "2", 1.0, 0),
        ("1+1=", "3", 0.0, 0),
        ("2+3=", "5", 1.0, 1),
        ("2+3=", "5", 1.0, 1),
        ("2+3=", "6", 0.0, 1),
    ]
    assert [s.advantage for s in samples[2:]] == pytest.approx([1 / 3, 1 / 3, -2 / 3])
    assert all(s.step == 7 and s.tokens == 1 for s in samples)


def test_one_prompt_shows_only_its_group() -> None:
    samples = batch_samples(build_batch(1, GROUPS), TOKENIZER, step=1, prompts=1)
    assert {s.prompt for s in samples} == {"1+1="} and len(samples) == 2


def test_the_log_appends_jsonl_and_writes_text_to_tensorboard(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = CompletionLog(tmp_path, every=5, prompts=1)
    assert [log.due(s) for s in (1, 5, 10, 11)] == [False, True, True, False]
    (sink,) = make_sinks(["tensorboard"], tmp_path, {})
    for step in (5, 10):
        log.write(batch_samples(build_batch(step, GROUPS), TOKENIZER, step, 1), [sink])
    sink.close()
    rows = read_samples(tmp_path)
    assert [(r["step"], r["completion"]) for r in rows] == [
        (5, "2"),
        (5, "3"),
        (10, "2"),
        (10, "3"),
    ]
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    texts = acc.Tensors("completions/text_summary")
    assert [t.step for t in texts] == [5, 10]
    assert "1+1=" in texts[0].tensor_proto.string_val[0].decode()


def test_never_due_when_off_and_nothing_read_without_the_file(tmp_path: Path) -> None:
    assert not CompletionLog(tmp_path, every=0, prompts=2).due(10)
    assert read_samples(tmp_path) == []


def test_a_live_read_leaves_a_torn_last_line_and_skips_a_broken_one(tmp_path: Path) -> None:
    log = CompletionLog(tmp_path, every=1, prompts=1)
    log.write(batch_samples(build_batch(1, GROUPS), TOKENIZER, 1, 1), [])
    whole = log.path.read_text()
    with log.path.open("a") as fh:
        fh.write('{"step": 2, "prom')  # a trainer killed mid-line ...
    assert [r["completion"] for r in read_samples(tmp_path)] == ["2", "3"]  # not yet whole
    log.write(batch_samples(build_batch(3, GROUPS), TOKENIZER, 3, 1), [])  # ... then resumed
    assert log.path.read_text().startswith(whole)
    assert [(r["step"], r["completion"]) for r in read_samples(tmp_path)] == [
        (1, "2"),
        (1, "3"),
        (3, "3"),  # the first line after the torn one is lost with it
    ]


def test_a_whole_last_sample_is_read_before_its_newline_arrives(tmp_path: Path) -> None:
    log = CompletionLog(tmp_path, every=1, prompts=1)
    log.write(batch_samples(build_batch(1, GROUPS), TOKENIZER, 1, 1), [])
    text = log.path.read_text()
    log.path.write_text(text.removesuffix("\n"))  # the newline is the last byte written
    assert [r["completion"] for r in read_samples(tmp_path)] == ["2", "3"]
