"""Every wire message class by its KIND: the core messages, the direct-payload ones, the
distillation ones and those of recomputed episodes."""

from __future__ import annotations

from grpo_stream.protocols.distill import TEACHING_MESSAGES
from grpo_stream.protocols.episodes import EPISODE_MESSAGES
from grpo_stream.protocols.messages import CORE_MESSAGES
from grpo_stream.protocols.payloads import PAYLOAD_MESSAGES
from grpo_stream.protocols.schema import Message

MESSAGES: dict[str, type[Message]] = {
    **CORE_MESSAGES,
    **PAYLOAD_MESSAGES,
    **TEACHING_MESSAGES,
    **EPISODE_MESSAGES,
}
"""Every message class by its KIND (kinds are unique across the four modules)."""
