"""The run configuration: one TOML file, validated by pydantic, overridable with `--set`.

Each part of the pipeline owns its settings model in its own package; this module
composes them into `RunConfig`, loads TOML, applies `section.key=value` overrides and
turns validation errors into one clear line naming the field.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from grpo_stream.algo.settings import AlgoSettings
from grpo_stream.envs.settings import EnvSettings, check_env_config
from grpo_stream.envs.verifiers_task import check_verifiers_config
from grpo_stream.evaluator.settings import EvalSettings, check_eval_config
from grpo_stream.hardware.settings import HardwareSettings
from grpo_stream.models.adapter import LORA_LR, LoraSettings
from grpo_stream.tasks.settings import TaskSettings
from grpo_stream.transport.settings import SecuritySettings, TransportSettings, WeightsSettings

DEFAULT_MODEL = "grpo-stream/tiny-arith"
"""Name of the tiny model that ships inside the package (resolved by grpo_stream.models)."""


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
    torch_threads: int | Literal["auto"] = 1
    """torch intra-op threads per torch service process (CPU): a number for each, or "auto":
    `up` splits its machine's cores among the trainer and generators it starts there, each
    pinned to its own (grpo_stream.launch.threads)."""
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

    @field_validator("torch_threads", mode="before")
    @classmethod
    def _threads(cls, value: object) -> object:
        if value == "auto" or (
            isinstance(value, int) and not isinstance(value, bool) and value >= 1
        ):
            return value
        raise ValueError(f'must be a whole number >= 1 or "auto", got {value!r}')


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
    """hf (transformers generate, CPU or GPU) or vllm (GPU hosts, `grpo-stream[vllm]`)."""
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
    prompts_per_request: int = Field(16, ge=1)
    """Prompts a generator asks for at once (its credits); scaled by its device share."""
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
    """hf: fetch new versions on a thread while decoding and swap them in between decoding
    steps of a running batch (each completion then carries per-token versions); false:
    fetch and apply between batches."""
    inflight_kv: Literal["recompute", "keep"] = "recompute"
    """In-flight swap: recompute the rows' KV cache under the new weights (every log-prob is
    a fresh forward's of the version that sampled it) or keep it (PipelineRL: no prefill, the
    log-prob after a swap is the mixed state's it was sampled with)."""

    @model_validator(mode="after")
    def _check(self) -> GeneratorSettings:
        if self.inflight_updates and self.engine == "vllm":
            raise ValueError(
                "generator.inflight_updates needs generator.engine = 'hf' (the vllm engine "
                "applies versions between batches)"
            )
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
    workers: int = Field(1, ge=1)
    """Worker processes per scorer that run reward functions."""
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
    """Largest policy-version lag of a trained group; 0 makes the run synchronous (on-policy)."""
    lease_timeout_s: float = Field(120.0, gt=0)
    """A lease not completed in time is re-dispatched even if its holder still beats."""
    checkpoint_every_s: float = Field(30.0, gt=0)
    """Seconds between hub checkpoints (buffer, cursor, leases, counters)."""
    replay: ReplaySettings = ReplaySettings()
    """The experience-replay buffer."""
    payloads: Literal["hub", "direct"] = "hub"
    """hub: completions travel through the hub (Rollout, ScoreRequest, TrainBatch). direct:
    each generator serves its Rollouts from a bounded store on its own ROUTER and the hub
    carries only metadata and references; scorers and the trainer fetch the payloads from
    the generator (grpo_stream.hub.payload_store). Needs trainer.ranks = 1 and no env."""
    payload_bind: str = "tcp://127.0.0.1:0"
    """payloads = direct: where each generator's payload store binds (port 0: a free one);
    scorers and the trainer must reach it."""
    fault_raise_at_step: int | None = None
    """Test hook: the hub raises right after serving this trainer step (only a hub that did
    not resume, so its restarted self carries on)."""


class TrainerSettings(BaseModel):
    """The trainer."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    lr: float = Field(1e-4, gt=0)
    """AdamW learning rate. Not given and trainer.lora.enabled: models.adapter.LORA_LR (2e-3)."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warm-up steps, then constant."""
    micro_batch: int = Field(64, ge=1)
    """Most sequences in one micro-batch (an upper bound beside micro_batch_tokens);
    gradients accumulate over micro-batches."""
    micro_batch_tokens: int = Field(16384, ge=1)
    """Token budget of one micro-batch's forward: rows x row width, padding included. Must
    hold the longest sequence (prompt + generator.max_tokens)."""
    minibatches: int = Field(1, ge=1, le=64)
    """Optimizer updates per batch (PPO-style): the batch's rows are split into this many
    minibatches, one AdamW step each, with pi_prox fixed at the batch's start (so the tis /
    decoupled clip can bind from the second on); step, version and lr schedule still advance
    once per batch, and a rollback discards the whole batch (training/minibatches.py).
    Needs trainer.ranks = 1 when above 1."""
    packing: bool = True
    """Pack several sequences into each row, padding-free (position ids restart per sequence,
    attention stays within each); false right-pads one sequence per row."""
    share_prompts: bool = True
    """Run each distinct prompt of a micro-batch once (a GRPO group's G completions attend to
    its KV cache, with grad) and the LM head only where a completion token is predicted; the
    same log-probs and gradients as the full-sequence forward (training/prompts.py). Used on
    one rank (not under DDP / FSDP2) without gradient_checkpointing, sdpa or eager attention;
    otherwise, or when no prompt repeats, packing applies."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward instead of keeping them
    (transformers' activation checkpointing, non-reentrant): less memory, more compute."""
    dropout: bool = False
    """Keep the model's dropout active in the training forward; off, the log-probs trained on
    are those of the deterministic policy that the generators sample."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the policy, reference, optimizer state and batches live: auto is cuda:LOCAL_RANK
    when CUDA is visible, else cpu."""
    precision: Literal["auto", "fp32", "bf16-mixed", "fp16-mixed", "bf16"] = "auto"
    """fp32; bf16-mixed (fp32 weights, bf16 autocast); fp16-mixed (fp16 autocast with a
    gradient scaler: an overflow skips the step); bf16 (bf16 weights, fp32 moments, Kahan-
    compensated updates: training/bf16.py). auto: bf16-mixed on GPUs, fp32 on CPU."""
    publish_every: int = Field(1, ge=1)
    """Publish new weights every this many steps."""
    checkpoint_every: int = Field(50, ge=1)
    """Write a checkpoint every this many steps (and at shutdown)."""
    keep_checkpoints: int = Field(2, ge=1)
    """Complete checkpoints kept on disk."""
    ranks: int = Field(1, ge=1)
    """torch.distributed ranks (torchrun) for the trainer."""
    devices: list[int] = []
    """run.placement = manual or colocated: NVML indices of the trainer's GPUs, one per rank."""
    rendezvous_port: int = Field(29500, ge=1, le=65535)
    """Trainer ranks on several hosts: torchrun's rendezvous port on the first trainer host."""
    rendezvous_timeout_s: float = Field(120.0, gt=0)
    """Trainer ranks on several hosts: how long a node waits to reach the rendezvous."""
    ddp_bucket_mb: float = Field(25.0, gt=0)
    """DDP gradient bucket size: buckets are all-reduced while backward still runs."""
    parallel: Literal["ddp", "fsdp2"] = "ddp"
    """How several ranks share the model: ddp replicates it and all-reduces gradient buckets;
    fsdp2 shards parameters, gradients and optimizer state per decoder layer (for models
    that do not fit one device)."""
    bind: str = "tcp://127.0.0.1:0"
    """Address of the weight server (ROUTER) and announcer (PUB uses the next port)."""
    announce_bind: str | None = None
    """Address of the weights announcer (PUB); None binds a free port on the bind host."""
    public_host: str | None = None
    """Host other machines use to reach the trainer (defaults to the bound host)."""
    fault_nan_step: int | None = None
    """Test hook: inject a NaN into the loss at this step to exercise rollback."""
    throttle_s: float = Field(0.0, ge=0)
    """Test hook: sleep this long after each applied step (a trainer slower than its
    generators, which then run ahead to the staleness gate); tests that kill a service mid-run
    use it so the run cannot end before the kill, however fast a step gets."""
    lora: LoraSettings = LoraSettings()
    """LoRA: train and publish a peft adapter instead of all weights."""

    @model_validator(mode="after")
    def _minibatches_one_rank(self) -> TrainerSettings:
        if self.minibatches > 1 and self.ranks > 1:
            raise ValueError(
                "trainer.minibatches > 1 needs trainer.ranks = 1 (each minibatch's loss "
                "normalisers are not summed across ranks)"
            )
        return self

    @model_validator(mode="after")
    def _lora_lr(self) -> TrainerSettings:
        """LoRA needs a higher lr than full fine-tuning: LORA_LR unless trainer.lr is given."""
        if self.lora.enabled and "lr" not in self.model_fields_set:
            self.lr = LORA_LR
        return self


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

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        if self.hub.replay.capacity < self.hub.groups_per_step:
            raise ValueError("hub.replay.capacity must be at least hub.groups_per_step")
        if self.hub.groups_per_step < self.trainer.ranks:
            # each rank trains its own groups of the step; a rank with none would leave the
            # others waiting in their collectives
            raise ValueError("hub.groups_per_step must be at least trainer.ranks")
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
        check_eval_config(self.eval.every, self.eval.task, self.task.holdout)
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


def _format_error(err: ValidationError) -> str:
    first = err.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "config"
    extra = f" ({len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return f"invalid config: {field}: {first['msg']}{extra}"


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse `section.key=value`; the value is read as TOML (so 3, 1e-4, true, "x" work)."""
    if "=" not in text:
        raise ConfigError(f"invalid override {text!r}: expected section.key=value")
    key, raw = text.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(f"invalid override {text!r}: empty key")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()  # a bare word is a string
    return path, value


def apply_override(data: dict[str, Any], path: list[str], value: Any) -> None:
    node = data
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"invalid override: {'.'.join(path)}: {part} is not a section")
        node = child
    node[path[-1]] = value


def load_config(path: Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a TOML file (or the defaults), apply overrides, validate."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"config file not found: {path}") from exc
        except IsADirectoryError as exc:
            raise ConfigError(f"config {path} is a directory: give a TOML file") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"invalid TOML in {path}: {exc}") from exc
    for text in overrides or []:
        keys, value = parse_override(text)
        apply_override(data, keys, value)
    return config_from_dict(data)


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc)) from None


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def dump_toml(data: dict[str, Any], prefix: str = "") -> str:
    """Minimal TOML writer for the resolved config (nested tables and scalars)."""
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    lines = [f"{k} = {_toml_value(v)}" for k, v in scalars.items()]
    out = "\n".join(lines)
    for name, table in tables.items():
        full = f"{prefix}{name}"
        body = dump_toml(table, prefix=f"{full}.")
        out += f"\n\n[{full}]\n{body}" if body.strip() else f"\n\n[{full}]"
    return out.strip() + "\n"
