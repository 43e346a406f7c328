"""TRL's GRPOConfig names mapped to ours (docs/reference/trl.md). Each of our settings the
table names is checked against RunConfig when the page is generated. Run through
scripts/gen_reference.py."""

from __future__ import annotations

from pydantic import BaseModel
from reference_settings import HEADER, _cell, setting_paths

# ----- TRL's GRPOConfig ------------------------------------------------------------------

TRL_VERSION = "1.16.0"
"""The TRL release whose GRPOConfig the table follows (bench.vs_trl runs it)."""

Mapping = tuple[str, str]
"""(our settings, comma-separated, or "" for none; a note). Each setting named is checked
against RunConfig when the page is generated."""

NOT_NEEDED_PROCESS = "not needed: generation is its own service, not a phase of the trainer"
NOT_NEEDED_VLLM_SERVER = (
    "not needed: a vllm generator runs vLLM in its own process; the hub's address is the only "
    "one it needs"
)

TRL_GRPO: dict[str, Mapping] = {
    # model and reference model
    "model_init_kwargs": (
        "model.dtype",
        "the model is loaded by name or path; dtype is the one load argument exposed",
    ),
    "trust_remote_code": ("", "no equivalent: models load without remote code"),
    "router_aux_loss_coef": ("", "no equivalent: no MoE auxiliary loss"),
    "disable_dropout": (
        "trainer.dropout",
        "inverted: trainer.dropout = false (the default) trains without dropout",
    ),
    "cast_lm_head_to_fp32": (
        "",
        "not needed: log-probs, loss and KL are float32 in every precision mode",
    ),
    # data
    "num_generations": ("generator.group_size", "G, completions per prompt"),
    "num_generations_eval": ("eval.k", "samples per problem in evaluation"),
    "max_completion_length": ("generator.max_tokens", ""),
    "ds3_gather_for_generation": (
        "",
        "not needed: no DeepSpeed; FSDP2 weights are gathered to rank 0 when published",
    ),
    "shuffle_dataset": (
        "task.seed",
        "the stream is always shuffled per epoch by "
        "(task.seed, epoch); task.streaming reads in file order",
    ),
    "pad_to_multiple_of": (
        "",
        "not needed: sequences are packed (trainer.packing) or run with shared prompts",
    ),
    # generation
    "generation_batch_size": (
        "generator.prompts_per_request",
        "prompts a generator takes at once (its credits): generation is its own service",
    ),
    "steps_per_generation": (
        "hub.max_staleness",
        "generation runs ahead of training by at most this many versions instead of in fixed turns",
    ),
    "temperature": ("generator.temperature", ""),
    "top_p": (
        "generator.top_p",
        "only 1.0: the importance weights need the full tempered distribution",
    ),
    "top_k": ("", "no equivalent: sampling is from the full tempered distribution"),
    "min_p": ("", "no equivalent: sampling is from the full tempered distribution"),
    "generation_kwargs": (
        "",
        "no equivalent: sampling is temperature only, so behaviour log-probs stay exact",
    ),
    "chat_template_kwargs": (
        "task.chat_template, task.system_prompt",
        "the chat template on or off, and a system turn",
    ),
    "repetition_penalty": (
        "",
        "no equivalent: it would change the sampling distribution the log-probs describe",
    ),
    "cache_implementation": ("", "not needed: the hf engine manages its own KV cache"),
    "use_vllm": ("generator.engine", '"vllm" (or "hf")'),
    "vllm_mode": ("", NOT_NEEDED_VLLM_SERVER + '; colocation is run.placement = "colocated"'),
    "vllm_model_impl": ("", "no equivalent: vLLM's own model implementation"),
    "vllm_enable_sleep_mode": ("", NOT_NEEDED_PROCESS),
    "vllm_structured_outputs_regex": ("", "no equivalent"),
    "vllm_server_base_url": ("", NOT_NEEDED_VLLM_SERVER),
    "vllm_server_host": ("", NOT_NEEDED_VLLM_SERVER),
    "vllm_server_port": ("", NOT_NEEDED_VLLM_SERVER),
    "vllm_server_timeout": (
        "transport.handshake_timeout_s",
        "how long a service waits for the hub's Welcome",
    ),
    "vllm_group_port": (
        "trainer.bind, trainer.announce_bind",
        "weights travel over ZeroMQ from the trainer's weight server, not an NCCL group",
    ),
    "vllm_gpu_memory_utilization": ("generator.gpu_memory_utilization", ""),
    "vllm_max_model_length": (
        "",
        "not needed: pre-flight checks that prompts plus "
        "generator.max_tokens fit the model's context",
    ),
    "vllm_tensor_parallel_size": ("generator.tensor_parallel", ""),
    # training
    "beta": ("algo.loss.beta", "k3 KL weight; 0 loads no reference model"),
    "num_iterations": (
        "trainer.minibatches",
        "updates per batch; ours split the batch into minibatches, one update each",
    ),
    "epsilon": ("algo.loss.eps_low", ""),
    "delta": (
        "algo.loss.dual_clip",
        "a bound on the loss of negative-advantage tokens (dual "
        "clip); TRL's delta bounds the ratio from above",
    ),
    "epsilon_high": ("algo.loss.eps_high", "default 0.28 (DAPO) here"),
    "sapo_temperature_neg": ("", "no equivalent: no SAPO loss"),
    "sapo_temperature_pos": ("", "no equivalent: no SAPO loss"),
    "vespo_k_pos": ("", "no equivalent: no VESPO loss"),
    "vespo_lambda_pos": ("", "no equivalent: no VESPO loss"),
    "vespo_k_neg": ("", "no equivalent: no VESPO loss"),
    "vespo_lambda_neg": ("", "no equivalent: no VESPO loss"),
    "importance_sampling_level": (
        "algo.loss.off_policy",
        "the PPO ratio is per token; the importance weight may be per sequence (seq_tis)",
    ),
    "reward_weights": ("task.rewards[].weight", "one weight per reward component"),
    "multi_objective_aggregation": (
        "task.rewards[].weight",
        "weighted sum, then normalised (TRL's sum_then_normalize)",
    ),
    "scale_rewards": ("algo.advantage.scale", '"group", "batch" or "none"'),
    "loss_type": (
        "algo.loss.aggregation",
        '"grpo", "dapo" or "dr_grpo"; bnpo, cispo, sapo, luspo and vespo have no equivalent',
    ),
    "mask_truncated_completions": (
        "",
        "no equivalent: truncated completions are trained "
        "(a length_penalty reward can discourage them)",
    ),
    "sync_ref_model": ("", "no equivalent: the reference stays the initial policy"),
    "ref_model_mixup_alpha": ("", "no equivalent: the reference stays the initial policy"),
    "ref_model_sync_steps": ("", "no equivalent: the reference stays the initial policy"),
    "top_entropy_quantile": ("", "no equivalent"),
    "entropy_coef": ("", "no equivalent: entropy is logged, not in the loss"),
    "use_adaptive_entropy": ("", "no equivalent"),
    "entropy_coef_min": ("", "no equivalent"),
    "entropy_coef_max": ("", "no equivalent"),
    "entropy_coef_delta": ("", "no equivalent"),
    "entropy_target": ("", "no equivalent"),
    "max_tool_calling_iterations": (
        "env.max_turns",
        "episodes against an environment (tools included) end after this many policy turns",
    ),
    "vllm_importance_sampling_correction": (
        "algo.loss.off_policy",
        "always corrected: behaviour (default), tis, decoupled, icepop or seq_tis",
    ),
    "vllm_importance_sampling_mode": (
        "algo.loss.off_policy",
        "token_truncate: tis; token_mask: decoupled (icepop with a lower edge too); "
        "sequence_truncate: seq_tis; sequence_mask: algo.loss.seq_mask, on the geometric or "
        "arithmetic mean of the token ratios rather than their product",
    ),
    "vllm_importance_sampling_clip_max": ("algo.loss.is_cap", ""),
    "vllm_importance_sampling_clip_min": (
        "algo.loss.is_floor",
        "the lower edge of icepop's band; tis truncates from above only",
    ),
    "off_policy_mask_threshold": (
        "algo.loss.behaviour_clip",
        "masks the tokens where the clip around the behaviour policy binds",
    ),
    "use_bias_correction_kl": ("", "no equivalent: k3 on the policy's own tokens"),
    "log_completions": (
        "run.log_completions",
        "every this many steps (0: never), to completions.jsonl, the console and the metric sinks",
    ),
    "log_multimodal": ("", "no equivalent: text only"),
    "num_completions_to_print": (
        "run.log_completions_prompts",
        "ours counts prompts, each with its G completions",
    ),
    "log_unique_prompts": ("", "not needed: each prompt is shown once, with its G completions"),
    "log_completions_hub_repo": ("", "no equivalent: nothing is uploaded"),
    "use_transformers_continuous_batching": (
        "",
        "not needed: the hf engine batches a PromptBatch's prompts itself",
    ),
    "transformers_continuous_batching_config": ("", "not needed: see above"),
    "use_transformers_paged": ("", "not needed: deprecated in TRL"),
    "vllm_importance_sampling_cap": ("algo.loss.is_cap", "deprecated in TRL"),
}
"""TRL GRPOConfig's own fields (not TrainingArguments') -> (our setting, note)."""

TRL_TRAINING_ARGS: dict[str, Mapping] = {
    "output_dir": ("run.run_dir", "or `--run-dir`"),
    "max_steps": ("run.max_steps", "or `--max-steps`"),
    "num_train_epochs": (
        "",
        "no equivalent: runs are counted in steps; the prompt stream wraps to a new epoch",
    ),
    "per_device_train_batch_size": (
        "hub.groups_per_step",
        "ours counts prompts (groups) per step; each has generator.group_size completions",
    ),
    "gradient_accumulation_steps": (
        "trainer.micro_batch_tokens, trainer.micro_batch",
        "a step is always one batch; it is cut into micro-batches by token budget",
    ),
    "learning_rate": ("trainer.lr", ""),
    "lr_scheduler_type": ("trainer.warmup_steps", "linear warm-up, then constant"),
    "warmup_steps": ("trainer.warmup_steps", ""),
    "weight_decay": ("trainer.weight_decay", "AdamW"),
    "optim": ("", "no equivalent: AdamW (fused where it can), KahanAdamW under precision bf16"),
    "max_grad_norm": (
        "algo.regularizer.tau0, algo.regularizer.clip_factor",
        "an adaptive bound instead of a fixed one: shrink toward tau, clip at 2 tau",
    ),
    "bf16": ("trainer.precision", '"bf16-mixed" (or "bf16": bf16 weights)'),
    "fp16": ("trainer.precision", '"fp16-mixed"'),
    "gradient_checkpointing": ("trainer.gradient_checkpointing", ""),
    "seed": ("run.seed", ""),
    "logging_steps": ("run.console_every", "every step goes to metrics.jsonl; this is the console"),
    "report_to": ("run.sinks", '"tensorboard", "wandb"'),
    "save_steps": ("trainer.checkpoint_every", ""),
    "save_total_limit": ("trainer.keep_checkpoints", ""),
    "use_cpu": ("trainer.device", '"cpu"'),
    "eval_steps": ("eval.every", ""),
}
"""The transformers TrainingArguments a GRPO user sets most -> (our setting, note)."""


def trl_fields_not_mapped() -> tuple[list[str], list[str]]:
    """(GRPOConfig's own fields missing from TRL_GRPO, TRL_GRPO names GRPOConfig lacks), read
    from the installed trl (the `bench` extra); raises ImportError without it."""
    import dataclasses

    from transformers import TrainingArguments
    from trl.trainer.grpo_config import GRPOConfig

    base = {f.name for f in dataclasses.fields(TrainingArguments)}
    own = [f.name for f in dataclasses.fields(GRPOConfig) if f.name not in base]
    return [n for n in own if n not in TRL_GRPO], [n for n in TRL_GRPO if n not in own]


def _ours(targets: str, known: set[str]) -> str:
    """`a, b` as code, each checked to be a setting (or a CLI flag starting with --)."""
    if not targets:
        return "–"
    out = []
    for target in (t.strip() for t in targets.split(",")):
        if not target.startswith("--") and target not in known:
            raise KeyError(f"the TRL table names {target!r}, which is not a setting")
        out.append(f"`{target}`")
    return ", ".join(out)


def trl_page(run_model: type[BaseModel]) -> str:
    known = setting_paths(run_model)
    out = [
        HEADER.format(what="a setting the table names, or the table in scripts/reference_trl.py"),
        "# From TRL's GRPOConfig",
        "",
        f"Each field of TRL's `GRPOConfig` (trl {TRL_VERSION}) and the setting of ours that does "
        "the same, or why there is none. Our names are checked against the settings when this "
        "page is generated. The run is one TOML file, so `num_generations = 8` in TRL is "
        "`[generator] group_size = 8` (or `--set generator.group_size=8`).",
        "",
        "What differs by design: TRL generates and trains in one process, in turns; grpo-stream "
        "runs generators, scorers, the hub and the trainer as separate services at the same "
        "time, so TRL's knobs for sharing one process or one GPU between generation and "
        "training (vLLM server or colocate mode, sleep mode, generation batch size, steps per "
        "generation) have no counterpart: a generator is its own service, and "
        "`hub.max_staleness` bounds how far generation may run ahead of training.",
        "",
        "## GRPOConfig",
        "",
        "| TRL | ours | note |",
        "| --- | --- | --- |",
    ]
    for name, (target, note) in TRL_GRPO.items():
        out.append(f"| `{name}` | {_ours(target, known)} | {_cell(note)} |")
    out += [
        "",
        "## transformers TrainingArguments",
        "",
        "`GRPOConfig` extends transformers' `TrainingArguments`; these are the ones a GRPO run "
        "sets most often. The others (logging, hub upload, DeepSpeed, evaluation strategy "
        "and the like) have no counterpart: grpo-stream logs every step to `metrics.jsonl`, "
        "its checkpoints are Hugging Face directories and its evaluation is `eval.*`.",
        "",
        "| TRL | ours | note |",
        "| --- | --- | --- |",
    ]
    for name, (target, note) in TRL_TRAINING_ARGS.items():
        out.append(f"| `{name}` | {_ours(target, known)} | {_cell(note)} |")
    return "\n".join(out).rstrip() + "\n"
