"""The hub's answer to a StatusRequest: its peers and counters, display only (`grpo-stream
status`, the dashboard); who may ask is `grpo_stream.session.hub`'s to decide."""

from __future__ import annotations

import os
from collections import Counter

from grpo_stream.hub.ledger import Ledger
from grpo_stream.hub.registry import Registry
from grpo_stream.protocols import messages as m


def hub_status(
    ledger: Ledger, registry: Registry, buffered: int, rejected: Counter[str]
) -> m.Status:
    counters = {
        **ledger.summary(),
        "buffer": buffered,
        "to_score": len(ledger.to_score),
        "to_teach": len(ledger.to_teach),
        "retry": len(ledger.retry),
        "peers_lost": registry.lost_total,
        "rejected": sum(rejected.values()),
        "hub_pid": os.getpid(),
    }
    return m.Status(
        services=registry.describe(),
        counters=counters,
        policy_version=ledger.versions.trainer_version,
    )
