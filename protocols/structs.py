"""Typed records inside messages (`Struct`s): each travels as a map of its fields, in
declaration order, and is checked field by field like a message's own (SPEC.md, "Structs").

Invariants:
- Every struct class defined here is registered in `schema.STRUCTS` by its name (the
  annotation text of a struct field), when this module is imported (`messages` imports it).
- A struct's fields are scalars, `X | None` and lists: no arrays, no structs (`schema`).
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_stream.protocols.schema import STRUCTS, Struct


@dataclass
class SamplingParams(Struct):
    """How a group's completions were sampled. The hub sets it in PromptBatch, the generator
    echoes it in Rollout, the hub in TrainBatch: the trainer computes log-probs at the
    temperature the data was sampled with, not at one of its own config."""

    temperature: float
    top_p: float
    max_tokens: int


@dataclass
class BatchTotals(Struct):
    """The loss normalisers of a whole step: sequences and completion tokens over all of its
    trainer ranks' shards (each rank normalises its part by these, so the ranks' averaged
    gradients equal the single-process one)."""

    num_seqs: int
    num_tokens: int


@dataclass
class StepStats(Struct):
    """What the hub knew when it served a step: reward, staleness and the ledger's counters
    (cumulative), the buffer, and the generators' heartbeats. The trainer writes these into
    metrics.jsonl with its own."""

    reward_mean: float  # NaN: no finite reward in the step's groups
    reward_std: float
    pass_rate: float
    staleness_mean: float  # versions behind the trainer, over the step's sequences
    staleness_counts: list[int]  # the step's sequences by versions behind (index: versions)
    groups_dispatched: int
    groups_trained: int
    groups_filtered: int
    groups_stale: int
    groups_failed: int
    groups_discarded: int
    groups_in_progress: int
    groups_redispatched: int
    groups_duplicates_dropped: int
    buffer_size: int
    peers_lost: int
    gen_instances: list[str]  # generators that reported a heartbeat, in registry order
    gen_tokens_per_s: list[float]  # their throughput, in the same order
    gen_wait_s: float  # their total time waiting for work
    step_groups: int  # groups in this step (all ranks): groups_per_step less its holes
    groups_refilled: int  # zero-signal groups replaced by new prompts (hub.max_refill_ratio)
    signal_rate: float  # share of recently scored groups with signal (the gate plans with it)
    distill_kl: float  # mean per-token reverse KL to the teacher since the last step; NaN: none
    scorer_cpu_s_per_completion: float  # the scorers' CPU seconds per completion scored (their
    # processes and reward workers, since each started); NaN: no scorer reported yet


@dataclass
class GeneratorStats(Struct):
    """A generator's counters in its heartbeat (throughput feeds the hub's work shares)."""

    tokens_per_s: float  # while generating (idle time excluded)
    wait_s: float  # total time waiting for work
    version: int  # the policy version its engine holds
    batches: int
    prompts_total: int
    busy_s: float


@dataclass
class ScorerStats(Struct):
    """A scorer's counters in its heartbeat (cumulative since its reward workers loaded)."""

    cpu_s: float  # CPU seconds of the scorer's process and its reward workers
    completions: int  # completions scored
    groups: int  # groups scored
    calls: int  # reward calls run (a completion repeated within its group runs once)
    workers: int  # reward worker processes


@dataclass
class Endpoints(Struct):
    """Where the rank-0 trainer serves its weights: announced in its Hello, handed by the hub
    to every peer in Welcome (only a trainer that passed the Hello checks can set them)."""

    weights: str  # the weight server's ROUTER (tcp:// or ipc://)
    announce: str  # its PUB of WeightsAnnounce


STRUCTS.update(
    {
        cls.__name__: cls
        for cls in (SamplingParams, BatchTotals, StepStats, GeneratorStats, ScorerStats, Endpoints)
    }
)
