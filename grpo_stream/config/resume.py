"""`up --resume`: the run directory's saved config is the run; a command line may change only
what does not change what is trained.

Invariant: a resumed run trains the same task, data, rewards, model and algorithm as the run it
continues. Its config is RUN_DIR/config.toml (what `up` wrote when the run started) with this
command line's `--config` file and `--set`s laid over it; a setting whose value would then
differ from the saved one is accepted only when it is in `SAFE_ON_RESUME` (more steps,
logging, evaluation, where services bind, how many of them run, memory knobs with the same
maths). Any other change is refused in one line naming the setting and how to train with it
deliberately (a new run from the checkpoint). A setting not listed is refused: a new setting
stays refused on resume until someone decides it is safe.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from grpo_stream.config.loading import config_data, config_from_dict
from grpo_stream.config.run import ConfigError, RunConfig, RunSettings

SAVED_CONFIG = "config.toml"
"""The resolved config `up` writes into the run directory."""

SAFE_ON_RESUME = (
    # how long, where and how loudly: never what a step computes
    "run.run_dir",
    "run.max_steps",
    "run.torch_threads",
    "run.sinks",
    "run.restarts",
    "run.abort_after_failed_groups",
    "run.placement",
    "run.stall_report_s",
    "run.stall_abort_s",
    "run.console_every",
    "run.log_completions",
    "run.log_completions_prompts",
    "model.params",
    # how many samplers run and where; what they sample stays (group_size, max_tokens, ...)
    "generator.engine",
    "generator.count",
    "generator.prompts_per_request",
    "generator.gpu_memory_utilization",
    "generator.vllm_block_size",
    "generator.tensor_parallel",
    "generator.devices",
    "generator.throttle",
    "scorer.",
    "teacher.count",
    "teacher.engine",
    "teacher.device",
    "teacher.groups_per_request",
    "teacher.timeout_s",
    "teacher.gpu_memory_utilization",
    "hub.bind",
    "hub.public_address",
    "hub.lease_timeout_s",
    "hub.checkpoint_every_s",
    "hub.payloads",
    "hub.payload_bind",
    "hub.fault_raise_at_step",
    # the same update in other memory layouts, and where the trainer lives
    "trainer.micro_batch",
    "trainer.micro_batch_tokens",
    "trainer.packing",
    "trainer.share_prompts",
    "trainer.prompt_rows",
    "trainer.gradient_checkpointing",
    "trainer.checkpoint_every",
    "trainer.keep_checkpoints",
    "trainer.ranks",
    "trainer.parallel",
    "trainer.devices",
    "trainer.rendezvous_port",
    "trainer.rendezvous_timeout_s",
    "trainer.ddp_bucket_mb",
    "trainer.bind",
    "trainer.announce_bind",
    "trainer.public_host",
    "trainer.fault_nan_step",
    "trainer.throttle_s",
    "transport.",
    "weights.",
    "security.",
    "hardware.",
    "eval.",
    "dashboard.",
)
"""Settings (a dotted name, or a section ending in `.`) a resume may change."""


def safe_on_resume(setting: str) -> bool:
    """Whether `setting` (dotted) may take a new value when a run resumes."""
    return any(
        setting.startswith(safe) if safe.endswith(".") else setting == safe
        for safe in SAFE_ON_RESUME
    )


def asked_run_dir(data: dict[str, Any]) -> Path:
    """The run directory a command line names (`run.run_dir` of its data, else the default)."""
    run = data.get("run")
    named = run.get("run_dir") if isinstance(run, dict) else None
    return Path(str(named)) if named else RunSettings().run_dir


def load_run_config(
    path: Path | None, overrides: list[str], resume: bool
) -> tuple[RunConfig, list[str]]:
    """The run's config and the settings this command line changed. A fresh start: the file
    and overrides as given. A resume of a run directory that holds a saved config: that
    config with the file and overrides laid over it (`resumed_config`)."""
    asked = config_data(path, overrides)
    saved = asked_run_dir(asked) / SAVED_CONFIG
    if not resume or not saved.is_file():
        return config_from_dict(asked), []
    try:
        base = tomllib.loads(saved.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"--resume: cannot read the run's config {saved}: {exc}") from None
    return resumed_config(without_derived(base), asked, saved.parent)


def without_derived(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved config less what `up` derived from where the run directory was: the run's own
    secret (`security.secret_file` = RUN_DIR/secret when the config named none), which `up`
    derives again from where the directory is now (a resume from another working directory,
    or of a moved run, finds it)."""
    security = saved.get("security")
    if not isinstance(security, dict) or "secret_file" not in security:
        return saved
    if Path(str(security["secret_file"])) != asked_run_dir(saved) / "secret":
        return saved
    kept = {k: v for k, v in security.items() if k != "secret_file"}
    return {**saved, "security": kept}


def resumed_config(
    saved: dict[str, Any], asked: dict[str, Any], run_dir: Path
) -> tuple[RunConfig, list[str]]:
    """`saved` (a run's config.toml) with `asked` laid over it; raises ConfigError, one line,
    at the first change that is not safe on resume. Returns the config and the settings
    whose value changed."""
    before = config_from_dict(saved)
    after = config_from_dict(overlay(saved, asked))
    old, new = _leaves(before.model_dump(mode="json")), _leaves(after.model_dump(mode="json"))
    keys = [*new, *(key for key in old if key not in new)]
    changed = [key for key in keys if old.get(key) != new.get(key)]
    refused = [key for key in changed if not safe_on_resume(key)]
    if refused:
        key, rest = refused[0], refused[1:]
        also = f" (so would {', '.join(rest)})" if rest else ""
        raise ConfigError(
            f"--resume continues {run_dir} as it was set up: {key} is {_show(old.get(key))} "
            f"there and this command sets {_show(new.get(key))}, which would change what is "
            f"trained{also}; drop it to resume, or train the checkpoint with it in a new run: "
            f'--run-dir NEW --set model.name_or_path="{run_dir}/checkpoints/step-N"'
        )
    return after, changed


def overlay(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`base` with `top`'s values laid over it, section by section (a list is one value)."""
    out = dict(base)
    for key, value in top.items():
        below = out.get(key)
        if isinstance(below, dict) and isinstance(value, dict):
            out[key] = overlay(below, value)
        else:
            out[key] = value
    return out


def _leaves(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every setting of a dumped config by its dotted name (a list or None is one value)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_leaves(value, f"{name}."))
        else:
            out[name] = value
    return out


def _show(value: Any) -> str:
    return "unset" if value is None else json.dumps(value)
