"""Large arrays travel without copies: encode hands out views, decode returns views."""

from __future__ import annotations

import numpy as np
import zmq

from grpo_stream.protocols import TrainBatch, decode, encode
from grpo_stream.protocols.make_golden import step_stats_example
from grpo_stream.protocols.messages import BatchTotals, SamplingParams


def _batch(seqs: int = 64, tokens: int = 4096) -> TrainBatch:
    ids = np.arange(seqs * tokens, dtype=np.int32)  # (S*T,): 1 MiB at the defaults
    return TrainBatch(
        step=1,
        group_ids=np.arange(seqs // 8, dtype=np.int64),
        input_ids=ids,
        seq_offsets=np.arange(0, seqs * tokens + 1, tokens, dtype=np.int64),
        prompt_lens=np.zeros(seqs, dtype=np.int32),
        behaviour_logprobs=np.full(seqs * tokens, -1.0, dtype=np.float32),
        advantages=np.zeros(seqs, dtype=np.float32),
        rewards=np.zeros(seqs, dtype=np.float32),
        versions=np.zeros(seqs, dtype=np.int32),
        group_offsets=np.arange(0, seqs + 1, 8, dtype=np.int64),
        totals=BatchTotals(num_seqs=seqs, num_tokens=seqs * tokens),
        sampling=SamplingParams(temperature=1.0, top_p=1.0, max_tokens=tokens),
        stats=step_stats_example(),
    )


def test_encode_hands_out_views_of_contiguous_arrays() -> None:
    batch = _batch()
    frames = encode(batch)
    ids_frame = frames[2]  # header, group_ids, input_ids, ...
    assert np.shares_memory(np.frombuffer(ids_frame, dtype=np.uint8), batch.input_ids)


def test_decoded_array_is_a_view_of_the_bytes_frame() -> None:
    frames = [bytes(f) for f in encode(_batch())]
    back = decode(frames)
    assert isinstance(back, TrainBatch)
    assert np.shares_memory(back.input_ids, np.frombuffer(frames[2], dtype=np.uint8))


def test_big_array_received_over_zmq_decodes_without_copy() -> None:
    ctx = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    try:
        for sock in (push, pull):
            sock.setsockopt(zmq.LINGER, 0)  # the test must never hang on close
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        push.connect(f"tcp://127.0.0.1:{port}")
        batch = _batch()
        push.send_multipart(encode(batch), copy=False)
        assert pull.poll(10_000), "no message within 10 s"
        frames = pull.recv_multipart(copy=False)
        back = decode(frames)
        assert isinstance(back, TrainBatch)
        received = np.frombuffer(frames[2].buffer, dtype=np.uint8)
        assert np.shares_memory(back.input_ids, received)
        assert np.array_equal(back.input_ids, batch.input_ids)
    finally:
        push.close()
        pull.close()
        ctx.term()
