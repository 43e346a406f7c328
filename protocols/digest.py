"""The digest a direct payload is known by (`RolloutMeta.digest`, `ScoreRef`, ...)."""

from __future__ import annotations

import hashlib

from grpo_stream.protocols.codec import encode
from grpo_stream.protocols.messages import Rollout
from grpo_stream.protocols.payloads import DIGEST_BYTES


def payload_digest(rollout: Rollout) -> str:
    """The blake2b-128 digest (hex) of a Rollout's canonical encoding: every frame, each
    prefixed by its length so frame boundaries count."""
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for frame in encode(rollout):
        h.update(len(frame).to_bytes(8, "little"))
        h.update(frame)
    return h.hexdigest()
