"""Checks of each message against the hub's state, before it changes anything.

Invariant: a message that fails a check changes nothing; the hub answers it with an
`Error` (code below), counts it in the server's `rejected` counters and logs it through
the shared rate limiter. Each check returns None (accepted) or the refusal's reason.

What a stranger can no longer do (without CURVE, any process on the network can connect):
- say Hello in any role, when the hub has the run's secret (`up` always gives it one);
- act in a peer's session: every message after Hello is sealed with its session's key
  (`grpo_stream.session.hub`), and ask for status without the secret or its status token;
- under CURVE, say Hello in a role other than its key's (`keys init` writes one per role);
- send a Scored whose rewards do not match the group's G completions (crashed the hub);
- ask for a batch of a step or version the trainer cannot have reached (froze the run:
  `BatchDesk.refusal`);
- say Hello as a second rank-0 trainer while the trainer is alive, to point every
  generator's weight fetches at its own endpoints;
- take over a live peer's connection by reusing its identity (the hub's ROUTER refuses a
  second connection with an identity in use: see `grpo_stream.transport.sockets`).
What an authenticated peer cannot do is checked in `grpo_stream.hub.trust` (leases, content,
quarantine).
"""

from __future__ import annotations

import numpy as np

from grpo_stream.hub.auth import HelloAuth, KeyRoles
from grpo_stream.hub.registry import Registry
from grpo_stream.protocols import messages as m
from grpo_stream.protocols.distill import Taught
from grpo_stream.protocols.episodes import EpisodeScored
from grpo_stream.protocols.payloads import RolloutMeta

WORKS = {
    m.Rollout: "generator",
    RolloutMeta: "generator",
    m.Scored: "scorer",
    EpisodeScored: "scorer",
    Taught: "teacher",
    m.BatchRequest: "trainer",
    m.RolloutEvidence: "trainer",
}
"""The only service that may send each kind of result."""

TRUST = frozenset(
    {
        "bad_hello",
        "bad_seal",
        "bad_status_request",
        "bad_lease",
        "bad_content",
        "bad_rollout",
        "quarantined",
    }
)
"""Refusals of what only a stranger or a misbehaving peer sends: each an error event."""


def check_role(service: str, msg: m.Message) -> str | None:
    wanted = WORKS.get(type(msg))
    if wanted is not None and service != wanted:
        return f"{msg.KIND} comes from a {wanted}, not a {service}"
    return None


def check_hello(
    hello: m.Hello,
    registry: Registry,
    auth: HelloAuth | None = None,
    roles: KeyRoles | None = None,
    user_id: str | None = None,
) -> str | None:
    """Signed with the run's secret when the hub has one, claiming the role of the CURVE key
    `user_id` it came with (`grpo_stream.hub.auth`); endpoints come only from the one live
    rank-0 trainer."""
    if auth is not None and (unsigned := auth.check(hello)) is not None:
        return unsigned
    if roles is not None and (wrong := roles.check(hello.service, user_id)) is not None:
        return wrong
    if hello.service != "trainer" or hello.rank != 0:
        if hello.endpoints is not None:
            return f"only the rank-0 trainer announces endpoints, not {hello.service}"
        return None
    for peer in registry.of("trainer"):
        if peer.rank == 0 and peer.instance != hello.instance:
            return f"trainer {peer.instance} (pid {peer.pid}) is rank 0 and alive"
    if hello.endpoints is None:
        return None
    for name, address in (
        ("weights", hello.endpoints.weights),
        ("announce", hello.endpoints.announce),
    ):
        if not address.startswith(("tcp://", "ipc://")):
            return f"endpoint {name!r} is not a tcp:// or ipc:// address"
    return None


def check_rollout(msg: m.Rollout, group_size: int) -> str | None:
    offsets = np.asarray(msg.completion_offsets)
    if len(offsets) != group_size + 1 or len(msg.texts) != group_size:
        return f"rollout of group {msg.group_id} has {len(offsets) - 1} completions, G={group_size}"
    n = len(msg.completion_ids)
    if offsets[0] != 0 or offsets[-1] != n or np.any(np.diff(offsets) < 0):
        return f"rollout of group {msg.group_id}: offsets do not cover its {n} tokens"
    if len(msg.logprobs) != n or len(msg.truncated) != group_size:
        return f"rollout of group {msg.group_id}: logprobs/truncated do not match its tokens"
    return check_token_versions(msg)


LOGPROB_MAX = 0.0
"""The largest behaviour log-prob a sampler can report: log p <= log 1 (in float32 a
log-softmax never rounds above it: x - max - log(sum(exp(x - max))) <= 0)."""


def check_numbers(msg: m.Rollout) -> str | None:
    """Numbers a sampler cannot produce: token ids that are not integers, behaviour log-probs
    that are NaN, infinite or above 0, a negative or non-finite generation time, episode
    rewards that are infinite (NaN is a failed episode). NaN log-probs passed every check
    before and made the trainer roll back step after step."""
    where = f"rollout of group {msg.group_id}"
    for name, ids in (("prompt_ids", msg.prompt_ids), ("completion_ids", msg.completion_ids)):
        arr = np.asarray(ids)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            return f"{where}: {name} is not a list of integer token ids ({arr.dtype})"
    logprobs = np.asarray(msg.logprobs)
    if logprobs.ndim != 1 or (logprobs.size and logprobs.dtype.kind != "f"):
        return f"{where}: logprobs is not a list of floats ({logprobs.dtype})"
    bad = int(np.count_nonzero(~np.isfinite(logprobs)))
    if bad:
        return f"{where}: {bad} behaviour log-probs are NaN or infinite"
    if logprobs.size and float(logprobs.max()) > LOGPROB_MAX:
        return f"{where}: a behaviour log-prob of {float(logprobs.max()):.4g} > 0 (p > 1)"
    if not np.isfinite(msg.gen_seconds) or msg.gen_seconds < 0:
        return f"{where}: gen_seconds {msg.gen_seconds} is not a duration"
    rewards = {"episode_rewards": msg.episode_rewards, "turn_rewards": msg.turn_rewards}
    for name, values in rewards.items():
        if np.isinf(np.asarray(values, dtype=np.float64)).any():
            return f"{where}: {name} holds an infinite reward"
    return None


def check_token_versions(msg: m.Rollout) -> str | None:
    """Per-token version runs (in-flight updates): starts 0, increasing, within the tokens;
    their oldest version is the rollout's policy_version (what staleness counts from)."""
    starts, versions = np.asarray(msg.token_version_starts), np.asarray(msg.token_versions)
    if len(starts) == 0 and len(versions) == 0:
        return None
    n = len(msg.completion_ids)
    if len(starts) != len(versions) or starts[0] != 0 or np.any(np.diff(starts) <= 0):
        return f"rollout of group {msg.group_id}: token version runs are not increasing from 0"
    if starts[-1] >= n or int(versions.min()) != msg.policy_version:
        return (
            f"rollout of group {msg.group_id}: token version runs past its {n} tokens or "
            f"oldest {int(versions.min())} != policy_version {msg.policy_version}"
        )
    return None


def check_scored(msg: m.Scored, rollout: m.Rollout | None) -> str | None:
    if rollout is None:
        return None  # not awaited: the ledger drops it (counted as a duplicate)
    g = len(rollout.texts)
    if len(msg.rewards) != g:
        return f"scored group {msg.group_id} has {len(msg.rewards)} rewards for G={g}"
    if np.asarray(msg.components).size != len(msg.component_names) * g:
        return f"scored group {msg.group_id}: components are not {len(msg.component_names)}x{g}"
    for name, values in (("rewards", msg.rewards), ("components", msg.components)):
        if np.isinf(np.asarray(values, dtype=np.float64)).any():  # NaN: a reward that failed
            return f"scored group {msg.group_id}: an infinite value in {name}"
    return None
