"""Settings of the ZeroMQ transport and its security."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TransportSettings(BaseModel):
    """Socket limits and timing shared by every service."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    max_message_bytes: int = Field(1 << 30, ge=1024)
    """Largest message (all frames) a receiver accepts; larger ones are rejected before decoding."""
    max_frame_bytes: int = Field(1 << 30, ge=1024)
    """Largest single frame a receiver accepts."""
    hwm: int = Field(1000, ge=1)
    """Send/receive high-water mark in messages on every socket (bounds memory per peer)."""
    linger_ms: int = Field(0, ge=0)
    """How long a closing socket keeps undelivered messages; 0 so shutdown never hangs."""
    handshake_timeout_s: float = Field(60.0, gt=0)
    """How long a service waits for the hub's Welcome before giving up."""
    heartbeat_interval_s: float = Field(1.0, gt=0)
    """How often services send Heartbeat to the hub."""
    heartbeat_timeout_s: float = Field(10.0, gt=0)
    """A peer silent for longer is declared lost and its leases re-dispatched."""
    io_timeout_ms: int = Field(5000, ge=1)
    """Longest a client send may wait for room under the high-water mark (then SendTimeout)."""
    weights_chunk_bytes: int = Field(64 << 20, ge=1)
    """Target tensor bytes per WeightsChunk message (a larger tensor travels alone)."""

    @model_validator(mode="after")
    def _check(self) -> TransportSettings:
        if self.heartbeat_timeout_s <= 2 * self.heartbeat_interval_s:
            raise ValueError("transport.heartbeat_timeout_s must exceed twice heartbeat_interval_s")
        if self.max_frame_bytes > self.max_message_bytes:
            raise ValueError("transport.max_frame_bytes must not exceed max_message_bytes")
        return self


class VerifySettings(BaseModel):
    """Verified rollouts: the trainer recomputes the log-prob of every sampled token and
    reports, per group, the mean |trainer - behaviour| gap per token; the hub quarantines a
    generator whose gap stays beyond `max_gap` (over the fleet's at the same staleness)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    enabled: bool = True
    """Keep the evidence and quarantine generators (off: the evidence is only logged)."""
    window: int = Field(32, ge=4, le=100_000)
    """A generator is judged on its last this many trained groups (none before it has them)."""
    max_gap: float = Field(0.5, gt=0)
    """Quarantine a generator whose median gap over its window, minus the fleet's typical gap
    at the same staleness (the 25th percentile of recent groups), exceeds this (nats per
    token). An honest generator's excess stays near 0: its gap is numerics and staleness,
    which the fleet shares; a different model's is its disagreement with the trainer."""
    max_bad_rollouts: int = Field(3, ge=1, le=1_000_000)
    """Quarantine a generator once this many of its rollouts were refused for what no honest
    sampler sends: log-probs that are NaN, infinite or above 0, lengths that disagree,
    episode fields on a single-turn run (or none on an episode run), environment turns the
    environment did not say. Each refusal is an error event and re-dispatches its leases."""


class SecuritySettings(BaseModel):
    """Who may act in a run: CURVE and client allow-listing, the run's secret, and the hub's
    checks of what authenticated peers send."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    curve: bool = False
    """Encrypt every socket with CURVE and accept only allow-listed client keys."""
    keys_dir: Path | None = None
    """Directory written by `grpo-stream keys init` (required when curve is on)."""
    client_name: str = Field("client", pattern=r"^[A-Za-z0-9_-]+$")
    """Which client key pair in keys_dir this process uses (`keys add DIR NAME` writes more)."""
    secret_file: Path | None = None
    """The run's shared secret (`up` writes RUN_DIR/secret, mode 0600): every Hello carries an
    HMAC with it and a hub with one refuses a Hello without a valid one (grpo_stream.hub.auth).
    None: Hellos are not authenticated (any process that reaches the hub may join). Services
    may get it from `GRPO_STREAM_SECRET` instead (a launcher's way across hosts)."""
    check_content: bool = True
    """The hub checks what each rollout carries against the model's tokenizer before it is
    scored: token ids inside the vocabulary, prompt ids those of the prompt it leased, texts
    the decoding of the token ids (the scorer scores what the trainer trains). Needs the
    model's tokenizer and config where the hub runs; off only for simulated fleets."""
    batch_crash_limit: int = Field(2, ge=1, le=100)
    """A step whose batch went to a rank-0 trainer that then died this many times in a row,
    before asking for the next step, is not served again: its groups end failed and the
    step gets new ones (a batch that crashes the trainer cannot stop the run)."""
    verify: VerifySettings = VerifySettings()
    """Verified rollouts (quarantine of a generator sampling from another model)."""

    @model_validator(mode="after")
    def _check(self) -> SecuritySettings:
        if self.curve and self.keys_dir is None:
            raise ValueError("security.keys_dir is required when security.curve is true")
        return self


class WeightsSettings(BaseModel):
    """How weight versions travel from the trainer to the generators."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    deltas: bool = True
    """Send a version as XOR+zstd deltas from the version the fetcher holds, when smaller."""
    delta_max_ratio: float = Field(0.5, gt=0, le=1)
    """Deltas are used only while a step delta is at most this fraction of the full set's
    bytes; a larger one is dropped and that version and the next 15 go in full, their deltas
    not computed (transport.versions.PROBE_EVERY). On one machine a delta costs more to
    encode and decode than its bytes save: measured 66-75% of the set for the fp32 tiny model
    at lr 1e-4, about 100 ms a fetch against 15-20 ms in full (2026-12-01, load ~6)."""
    delta_window: int = Field(4, ge=1, le=1024)
    """Versions the server keeps step deltas for: a fetcher holding one of the last this many
    versions gets a delta, older ones the full set. Memory: this many compressed step deltas
    (measured 0.05 of the set each at lr 1e-6, 0.19 at lr 1e-5, bf16)."""
    zstd_level: int = Field(3, ge=1, le=19)
    """zstd compression level of the deltas (3: about 1 GiB/s per core on sparse XORs)."""
    relay: bool = False
    """Generators serve what they fetch to others, and the server redirects fetchers to them."""
    fanout: int = Field(4, ge=1, le=1024)
    """Children per node of the relay tree: the server streams each version to at most this many
    fetchers at once per base version, each relay to at most this many."""
    relay_bind: str = "tcp://127.0.0.1:0"
    """Where a relaying generator binds (port 0: a free one); other generators must reach it."""
    relay_stall_s: float = Field(5.0, gt=0)
    """A relay that sends nothing for this long is given up; the fetcher re-fetches direct."""
    fetch_stall_s: float = Field(10.0, gt=0, le=3600)
    """A weight server that sends nothing for this long during a fetch (it died mid-transfer)
    fails the fetch; the generator retries, with backoff, at the address the hub gives now."""
