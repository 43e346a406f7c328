"""Golden vectors: each decodes and re-encodes byte for byte; SPEC.md documents every field."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_stream.protocols import MESSAGES, Message, decode, encode
from grpo_stream.protocols.make_golden import GOLDEN_DIR, examples, read_frames
from grpo_stream.protocols.schema import schema

SPEC = GOLDEN_DIR.parent / "SPEC.md"


def _golden(kind: str) -> Path:
    return Path(GOLDEN_DIR, f"{kind}.frames")


@pytest.mark.parametrize("kind", sorted(MESSAGES))
def test_golden_vector_reencodes_byte_for_byte(kind: str) -> None:
    frames = read_frames(_golden(kind))
    msg = decode(frames)
    assert kind == msg.KIND
    assert [bytes(f) for f in encode(msg)] == frames


@pytest.mark.parametrize("msg", examples(), ids=lambda m: m.KIND)
def test_example_encodes_to_its_golden_vector(msg: Message) -> None:
    assert [bytes(f) for f in encode(msg)] == read_frames(_golden(msg.KIND))


def test_every_golden_file_is_a_known_kind() -> None:
    assert sorted(p.stem for p in GOLDEN_DIR.glob("*.frames")) == sorted(MESSAGES)


def test_spec_documents_every_kind_and_field() -> None:
    text = SPEC.read_text()
    sections = {part.split("\n", 1)[0].strip(): part for part in text.split("\n### ")[1:]}
    for kind, cls in MESSAGES.items():
        assert kind in sections, f"SPEC.md has no section for {kind}"
        for spec in schema(cls):
            assert f"| {spec.name} |" in sections[kind], f"SPEC.md: {kind}.{spec.name} missing"
