"""Seals: a message after Hello is bound to its session's key, numbered once per channel."""

from __future__ import annotations

import hashlib
import hmac

import numpy as np

from grpo_stream.protocols import messages as m
from grpo_stream.protocols.codec import encode
from grpo_stream.transport.seal import BEATS, MAIN, SEAL_BYTES, Opener, Sealer, is_seal, parse

KEY = bytes(range(32))


def _frames() -> list[bytes]:
    msg = m.Scored(lease_id=1, group_id=2, rewards=np.ones(2, np.float32), component_names=["r"],
                   components=np.ones((1, 2), np.float32), errors=["", ""])  # fmt: skip
    return [bytes(f) for f in encode(msg)]


def _seal(sealer: Sealer, frames: list[bytes]):  # type: ignore[no-untyped-def]
    return parse(sealer.seal(frames), frames)


def test_the_tag_is_hmac_sha256_over_the_head_and_each_frame_with_its_length() -> None:
    frames = _frames()
    raw = Sealer(KEY, MAIN).seal(frames)
    data = raw[:12] + b"".join(len(f).to_bytes(8, "little") + f for f in frames)
    assert len(raw) == SEAL_BYTES and raw[:3] == b"\xc1S1"
    assert raw[12:] == hmac.new(KEY, data, hashlib.sha256).digest()[:16]


def test_a_seal_is_told_from_a_header_by_its_first_byte() -> None:
    frames = _frames()
    assert is_seal(Sealer(KEY, MAIN).seal(frames))
    assert not is_seal(frames[0])  # a msgpack map


def test_the_sessions_own_seals_open_in_order() -> None:
    sealer, opener = Sealer(KEY, MAIN), Opener(KEY)
    assert [opener.open(_seal(sealer, _frames())) for _ in range(3)] == [None, None, None]


def test_a_replayed_seal_is_refused() -> None:
    sealer, opener = Sealer(KEY, MAIN), Opener(KEY)
    frames = _frames()
    seal = _seal(sealer, frames)
    assert opener.open(seal) is None
    assert "replayed" in str(opener.open(seal))


def test_channels_are_numbered_apart() -> None:
    main, beats, opener = Sealer(KEY, MAIN), Sealer(KEY, BEATS), Opener(KEY)
    assert opener.open(_seal(main, _frames())) is None
    assert opener.open(_seal(beats, _frames())) is None  # its own 1, not below main's


def test_another_key_or_altered_frames_are_refused() -> None:
    frames = _frames()
    stranger = _seal(Sealer(bytes(32), MAIN), frames)
    assert "another key" in str(Opener(KEY).open(stranger))
    raw = Sealer(KEY, MAIN).seal(frames)
    altered = [frames[0], bytes(len(frames[1])), *frames[2:]]  # the rewards' bytes zeroed
    assert "another key" in str(Opener(KEY).open(parse(raw, altered)))


def test_no_seal_is_refused_and_a_malformed_one_is_none() -> None:
    assert "not sealed" in str(Opener(KEY).open(None))
    assert parse(b"\xc1S1short", []) is None
