"""Write (or check) the golden test vectors: one deterministic example per message kind.

Run `python -m grpo_stream.protocols.make_golden` to regenerate protocols/golden/ after a
deliberate protocol change, `--check` to verify the files match the codec.

File format of `golden/<kind>.frames`: the message's frames in order, each as a 4-byte
big-endian unsigned length followed by that many bytes; nothing else.

Invariant: the examples are fixed values (no clocks, no randomness), so encoding them
gives the same bytes on every machine.
"""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

import numpy as np

from grpo_stream.protocols import distill as t
from grpo_stream.protocols import episodes as e
from grpo_stream.protocols import messages as m
from grpo_stream.protocols import payloads as p
from grpo_stream.protocols.arrays import wire_dtypes
from grpo_stream.protocols.codec import encode
from grpo_stream.protocols.kinds import MESSAGES

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"


def write_frames(path: Path, frames: list[bytes | memoryview]) -> None:
    """Store frames as (4-byte big-endian length, bytes) records."""
    with path.open("wb") as fh:
        for frame in frames:
            data = bytes(frame)
            fh.write(struct.pack(">I", len(data)))
            fh.write(data)


def read_frames(path: Path) -> list[bytes]:
    """Frames stored by `write_frames`; raises ValueError on a truncated file."""
    data = path.read_bytes()
    frames, pos = [], 0
    while pos < len(data):
        if pos + 4 > len(data):
            raise ValueError(f"{path}: truncated length at byte {pos}")
        (size,) = struct.unpack_from(">I", data, pos)
        pos += 4
        if pos + size > len(data):
            raise ValueError(f"{path}: truncated frame at byte {pos}")
        frames.append(data[pos : pos + size])
        pos += size
    return frames


def step_stats_example() -> m.StepStats:
    return m.StepStats(
        reward_mean=0.5,
        reward_std=0.5,
        pass_rate=0.5,
        staleness_mean=1.0,
        staleness_counts=[0, 16],
        groups_dispatched=20,
        groups_trained=12,
        groups_filtered=3,
        groups_stale=1,
        groups_failed=0,
        groups_discarded=0,
        groups_in_progress=4,
        groups_redispatched=2,
        groups_duplicates_dropped=0,
        buffer_size=2,
        peers_lost=0,
        gen_instances=["gen-0", "gen-1"],
        gen_tokens_per_s=[1234.5, 987.25],
        gen_wait_s=2.5,
        step_groups=2,
        groups_refilled=1,
        signal_rate=0.75,
        scorer_cpu_s_per_completion=0.00125,
        distill_kl=0.125,
    )


def _data_examples() -> list[m.Message]:
    completion = np.array([5, 6, 7, 8, 9, 10, 11], dtype=np.int32)
    return [
        m.PromptBatch(
            lease_id=7,
            group_ids=np.array([100, 101], dtype=np.int64),
            prompts=["1+2=", "3+4="],
            references=[{"answer": "3"}, {"answer": "7"}],
            group_size=2,
            sampling=m.SamplingParams(temperature=1.0, top_p=0.95, max_tokens=8),
            min_version=3,
        ),
        m.Rollout(
            lease_id=7,
            group_id=100,
            instance="gen-0",
            policy_version=4,
            prompt_ids=np.array([1, 2, 3, 4], dtype=np.int32),
            completion_ids=completion,
            completion_offsets=np.array([0, 3, 7], dtype=np.int64),
            logprobs=np.linspace(-3.0, -0.5, 7, dtype=np.float32),
            texts=["3", "4 "],
            truncated=[False, True],
            gen_seconds=0.25,
            sampling=m.SamplingParams(temperature=1.0, top_p=0.95, max_tokens=8),
            loss_mask=np.array([1, 0, 1, 1, 1, 1, 1], dtype=np.uint8),
            episode_rewards=np.array([1.1, np.nan], dtype=np.float32),
            turn_rewards=np.array([0.1, 1.0, 0.0], dtype=np.float32),
            turn_starts=np.array([0, 2, 0], dtype=np.int64),
            turn_offsets=np.array([0, 2, 3], dtype=np.int64),
            errors=["episode[1]: step raised ValueError: bad"],
            token_version_starts=np.array([0, 2, 3, 5], dtype=np.int64),
            token_versions=np.array([4, 5, 4, 5], dtype=np.int64),
        ),
        m.ScoreRequest(
            lease_id=9, group_id=100, prompt="1+2=", completions=["3", "4 "], reference={"a": "3"}
        ),
        m.Scored(
            lease_id=9,
            group_id=100,
            rewards=np.array([1.0, np.nan], dtype=np.float32),
            component_names=["exact", "format"],
            components=np.array([[1.0, np.nan], [1.0, 0.0]], dtype=np.float32),
            errors=["", "timeout"],
        ),
        m.TrainBatch(
            step=12,
            group_ids=np.array([100], dtype=np.int64),
            input_ids=np.array([1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 8, 9], dtype=np.int32),
            seq_offsets=np.array([0, 7, 13], dtype=np.int64),
            prompt_lens=np.array([4, 4], dtype=np.int32),
            behaviour_logprobs=np.array([-1.0, -0.5, -0.25, -2.0, -1.5], dtype=np.float32),
            advantages=np.array([0.7071, -0.7071], dtype=np.float32),
            rewards=np.array([1.0, 0.0], dtype=np.float32),
            versions=np.array([4, 4], dtype=np.int32),
            group_offsets=np.array([0, 2], dtype=np.int64),
            totals=m.BatchTotals(num_seqs=2, num_tokens=4),
            sampling=m.SamplingParams(temperature=1.0, top_p=0.95, max_tokens=8),
            stats=step_stats_example(),
            loss_mask=np.array([1, 0, 1, 1, 1], dtype=np.uint8),
            token_advantages=np.array([0.5, 0.0, 0.9, -0.7, -0.7], dtype=np.float32),
        ),
        m.WeightsChunk(
            version=5,
            index=0,
            count=1,
            names=["embed.weight", "norm.bias", "empty"],
            tensors=[
                np.arange(6, dtype=np.float32).reshape(2, 3).astype(wire_dtypes()["bfloat16"]),
                np.array([40, 181, 47, 253, 0, 1, 2, 3], dtype=np.uint8),  # bytes of a delta
                np.zeros((0, 4), dtype=np.float32),
            ],
            base=4,
            encodings=["raw", "xor_zstd", "raw"],
            checksums=[1, 18446744073709551615, 3],
            checksum=12345678901234567890,
        ),
    ]


def _control_examples() -> list[m.Message]:
    return [
        m.Hello(
            service="generator",
            instance="gen-0",
            host="node1",
            pid=4242,
            capacity=16,
            rank=0,
            fingerprint={"device": "cpu", "cores": 2, "score": 0.5},
            endpoints=m.Endpoints(weights="tcp://10.0.0.1:5601", announce="tcp://10.0.0.1:5602"),
            auth="v2:1700000000000:00112233445566778899aabbccddeeff:" + "0f" * 16 + ":" + "ab" * 32,
        ),
        m.Challenge(challenge="0f" * 16, in_reply_to="hello"),
        m.Welcome(
            run_id="run-1",
            config={"hub": {"groups_per_step": 16}, "model": {"name_or_path": "tiny"}},
            config_digest="0123456789abcdef",
            peers=m.Endpoints(weights="tcp://127.0.0.1:5601", announce="tcp://127.0.0.1:5602"),
            policy_version=3,
        ),
        m.Heartbeat(
            instance="gen-0",
            stats={"busy": True},
            hub_rtt_s=0.0015,
            generator=m.GeneratorStats(
                tokens_per_s=1234.5, wait_s=2.5, version=4, batches=9, prompts_total=36, busy_s=1.75
            ),
        ),
        m.WorkRequest(instance="gen-0", credits=16),
        m.BatchRequest(step=12, trainer_version=4, rank=0, world_size=1),
        m.WeightsAnnounce(version=5, num_tensors=3, total_bytes=32, checksum=42),
        m.WeightsRequest(
            version=-1,
            have=4,
            relay="tcp://10.0.0.2:5601",
            direct=False,
            auth="v2:1700000000000:00112233445566778899aabbccddeeff:" + "cd" * 32,
        ),
        m.WeightsRedirect(version=5, base=4, address="tcp://10.0.0.2:5601", checksum=42),
        m.StatusRequest(
            auth="v2:1700000000000:00112233445566778899aabbccddeeff:" + "0f" * 16 + ":" + "ef" * 32
        ),
        m.RolloutEvidence(
            step=12, group_ids=[100, 101], gaps=[0.015, 2.5], tokens=[7, 12], staleness=[1, 0]
        ),
        m.Status(
            services=[{"service": "generator", "instance": "gen-0", "alive": True}],
            counters={"groups_trained": 48, "groups_dropped_stale": 1},
            policy_version=5,
        ),
        m.Error(code="bad_type", message="rollout.texts: expected list_str", in_reply_to="rollout"),
        m.Shutdown(reason="max_steps reached"),
    ]


def _payload_examples() -> list[m.Message]:
    sampling = m.SamplingParams(temperature=1.0, top_p=0.95, max_tokens=8)
    digest = "00112233445566778899aabbccddeeff"
    return [
        p.RolloutMeta(
            lease_id=7,
            group_id=100,
            instance="gen-0",
            policy_version=4,
            source="tcp://10.0.0.3:5701",
            digest=digest,
            prompt_len=4,
            completion_lens=np.array([3, 4], dtype=np.int64),
            truncated=[False, True],
            gen_seconds=0.25,
            sampling=sampling,
        ),
        p.ScoreRef(
            lease_id=9,
            group_id=100,
            prompt="1+2=",
            reference={"answer": "3"},
            source="tcp://10.0.0.3:5701",
            digest=digest,
        ),
        p.PayloadRequest(group_id=100, digest=digest),
        p.TrainBatchRef(
            step=12,
            group_ids=np.array([100], dtype=np.int64),
            sources=["tcp://10.0.0.3:5701"],
            digests=[digest],
            versions=np.array([4], dtype=np.int64),
            group_offsets=np.array([0, 2], dtype=np.int64),
            completion_lens=np.array([3, 4], dtype=np.int64),
            rewards=np.array([1.0, np.nan], dtype=np.float32),
            advantages=np.array([0.7071, 0.0], dtype=np.float32),
            valid=np.array([1, 0], dtype=np.uint8),
            totals=m.BatchTotals(num_seqs=1, num_tokens=3),
            sampling=sampling,
            stats=step_stats_example(),
        ),
        p.PayloadLost(
            group_ids=[100, 101],
            reason="trainer: 2 of 16 groups",
            step=12,
            trainer_version=4,
            attempt=0,
            codes=["payload_evicted", "unreachable"],
        ),
    ]


def _teaching_examples() -> list[m.Message]:
    return [
        t.TeachRequest(
            lease_id=11,
            group_id=100,
            prompt_ids=np.array([1, 2, 3, 4], dtype=np.int32),
            completion_ids=np.array([5, 6, 7, 8, 9, 10, 11], dtype=np.int32),
            completion_offsets=np.array([0, 3, 7], dtype=np.int64),
            temperature=1.0,
        ),
        t.Taught(
            lease_id=11,
            group_id=100,
            logprobs=np.linspace(-2.5, -0.25, 7, dtype=np.float32),
            error="",
        ),
    ]


def _episode_examples() -> list[m.Message]:
    offsets = np.array([0, 3, 4], dtype=np.int64)
    reference = {"target": 11, "high": 16}
    actions = ["8", "12", "10", "7"]
    rewards = np.array([0.1, 0.1, 0.1, np.nan], dtype=np.float32)
    said = ["higher 9-16:", "lower 9-11:", "higher 11-11:", ""]
    errors = ["", "step raised ValueError: x"]
    return [
        e.EpisodeScoreRequest(13, 100, "guess 1-16:", reference, actions, offsets),
        e.EpisodeScored(13, 100, rewards, said, [False] * 4, errors),
    ]


def examples() -> list[m.Message]:
    """One fixed example of every message kind, in registry order."""
    every = (
        _control_examples()
        + _data_examples()
        + _payload_examples()
        + _teaching_examples()
        + _episode_examples()
    )
    by_kind = {msg.KIND: msg for msg in every}
    return [by_kind[kind] for kind in MESSAGES]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="verify instead of writing")
    parser.add_argument("--out", type=Path, default=GOLDEN_DIR, help="golden directory")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    stale = []
    for msg in examples():
        path = args.out / f"{msg.KIND}.frames"
        frames = encode(msg)
        if not args.check:
            write_frames(path, frames)
        elif not path.exists() or read_frames(path) != [bytes(f) for f in frames]:
            stale.append(path.name)
    if stale:
        print(f"golden vectors out of date: {', '.join(stale)}", file=sys.stderr)
        return 1
    print(f"{'checked' if args.check else 'wrote'} {len(MESSAGES)} golden vectors in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
