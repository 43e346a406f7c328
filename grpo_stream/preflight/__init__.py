"""Pre-flight: the run's inputs checked before any service starts, each failure one line.

`preflight(cfg)` runs every check in order and raises `PreflightError` at the first bad
input, with a message that says what is wrong, the numbers, and the setting to change. It
creates nothing (no run directory), imports neither torch nor transformers, and takes well
under a second (a second more with a user reward: its sandboxed worker's start) unless it
has to ask the Hugging Face hub whether a model exists.

Checks: the model resolves (the shipped tiny model, a local directory, a name in the local
Hugging Face cache, or a name the hub knows: offline mode is honoured); the task's data file
exists and has the named fields; every reward loads, and the built-ins and user functions
score a sample completion (user ones in the scorer's sandbox: `preflight.rewards`); the
longest of the first `FIT_PROBLEMS` prompts plus `generator.max_tokens` fits the model's
context; `trainer.context_parallel` divides the model's attention heads and is no longer
than the run's longest sequence; the task and engine suit the model (a chat template where
`task.chat_template` asks for one, a supported vLLM installed where `generator.engine`
names it); a distillation teacher resolves and shares the policy's vocabulary; env.agent
loads (an async function) with its libraries installed; the run directory is writable with
room for a checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from importlib import resources, util
from pathlib import Path
from typing import Any

from grpo_stream.agents.client import load_agent
from grpo_stream.config import RunConfig
from grpo_stream.config.trainer import check_context_heads
from grpo_stream.engines.vllm import compat as vllm_compat
from grpo_stream.models.loading import SHIPPED_MODELS
from grpo_stream.preflight.data import DataCheckError
from grpo_stream.preflight.data import check_data as check_task_data
from grpo_stream.tasks import TaskDataError, make_task

FIT_PROBLEMS = 32
"""Prompts of the first this many problems are measured against the model's context."""
HUB_TIMEOUT_S = 3.0
"""How long the model check waits for the Hugging Face hub before calling it unreachable."""
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")
"""Fields of a model's config.json that hold its context length, first found wins."""


class PreflightError(ValueError):
    """An input of the run is unusable; the message is one line naming the setting."""


@dataclass(frozen=True)
class ModelSource:
    """Where the model comes from; `path` is a local directory when there is one."""

    name: str
    where: str  # "package", "local directory", "Hugging Face cache", "Hugging Face hub"
    path: Path | None


def preflight(cfg: RunConfig, local_model: bool = True) -> list[str]:
    """Every check, in order; returns one `ok` line per check. Raises PreflightError.

    `local_model=False` (a hub started alone, a cluster run): the model is loaded on other
    hosts, so a model that does not resolve here is not an error; it is still measured
    against the prompts when it does.
    """
    done: list[str] = []
    source = find_model(cfg.model.name_or_path, ask_hub=local_model, required=local_model)
    done.append(f"model: {cfg.model.name_or_path} ({source.where if source else 'not here'})")
    done.append(check_data(cfg))
    done.append(check_fit(cfg, source))
    if cfg.trainer.context_parallel > 1:
        done.append(check_context(cfg, source))
    done.append(check_compatible(cfg, source))
    if cfg.algo.distill.teacher is not None:
        done.append(check_teacher(cfg, source, local_model))
    if cfg.env.agent is not None:
        done.append(check_agent(cfg))
    done.append(check_run_dir(Path(cfg.run.run_dir), checkpoint_bytes(source)))
    return done


def check_config_file(path: Path | None) -> None:
    """--config must name a TOML file (not a directory, not a missing path)."""
    if path is None or path.is_file():
        return
    what = "is a directory" if path.is_dir() else "does not exist"
    raise PreflightError(f"--config {path} {what}: give the path of a run config TOML file")


# ----- model -----------------------------------------------------------------------------
def find_model(
    name: str, ask_hub: bool = True, required: bool = True, setting: str = "model.name_or_path"
) -> ModelSource | None:
    """Resolve a model name or path without downloading anything; `setting` is what the
    error lines call it (`--model` for eval)."""
    if name in SHIPPED_MODELS:
        asset = SHIPPED_MODELS[name]
        path = Path(str(resources.files("grpo_stream").joinpath("assets", asset)))
        return ModelSource(name, "package", path)
    local = Path(name).expanduser()
    if _looks_local(name, local):
        if local.is_dir() and (local / "config.json").is_file():
            return ModelSource(name, "local directory", local)
        if not required:
            return None
        what = "is not a directory" if local.exists() else "does not exist"
        if local.is_dir():
            what = "has no config.json (not a Hugging Face model directory)"
        raise PreflightError(f"{setting}: {name} {what}")
    cached = _cached_dir(name, required)
    if cached is not None:
        return ModelSource(name, "Hugging Face cache", cached)
    if not required:
        return None
    if _offline():
        raise PreflightError(
            f"model.name_or_path: {name} is not in the local Hugging Face cache and "
            f"HF_HUB_OFFLINE is set: download it first (`hf download {name}`) or unset "
            "HF_HUB_OFFLINE"
        )
    if ask_hub:
        _ask_hub(name)
    return ModelSource(name, "Hugging Face hub: downloaded at start", None)


def _looks_local(name: str, local: Path) -> bool:
    """A path, not a hub name: written as one, existing, or under an existing directory
    (`runs/default/checkpoints/step-9` with `runs/` here)."""
    if name.startswith(("/", "./", "../", "~")) or local.exists():
        return True
    return len(local.parts) > 1 and Path(local.parts[0]).is_dir()


def _cached_dir(name: str, required: bool) -> Path | None:
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        found = try_to_load_from_cache(name, "config.json")
    except HFValidationError:
        if not required:
            return None
        raise PreflightError(
            f"model.name_or_path: {name!r} is neither a local model directory nor a "
            "Hugging Face model name (org/name)"
        ) from None
    return Path(found).parent if isinstance(found, str) else None


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _ask_hub(name: str) -> None:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(name, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        raise PreflightError(
            f"model.name_or_path: {name} is gated on the Hugging Face hub: accept its licence "
            "on its page and log in (`hf auth login`)"
        ) from None
    except RepositoryNotFoundError:
        raise PreflightError(
            f"model.name_or_path: {name} is not a model on the Hugging Face hub (check the "
            "name; for a private model log in with `hf auth login`)"
        ) from None
    except Exception as exc:  # any network failure means the same to the user
        raise PreflightError(
            f"model.name_or_path: {name} is not in the local Hugging Face cache and the hub "
            f"is unreachable ({type(exc).__name__}): download it where there is a network "
            "(`hf download NAME`) or set model.name_or_path to a local directory"
        ) from None


def _model_config(source: ModelSource | None) -> dict[str, Any]:
    if source is None or source.path is None:
        return {}
    data = json.loads((source.path / "config.json").read_text())
    return data if isinstance(data, dict) else {}


def context_length(source: ModelSource | None) -> int | None:
    """The model's context in tokens, from its config.json, when it is here."""
    config = _model_config(source)
    for key in CONTEXT_KEYS:
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def checkpoint_bytes(source: ModelSource | None) -> int:
    """Room one checkpoint needs, estimated: the weights in float32 and AdamW's two moments
    (3x fp32); 0 when the weights are not here to measure."""
    if source is None or source.path is None:
        return 0
    weights = sum(p.stat().st_size for p in source.path.glob("*.safetensors"))
    weights += sum(p.stat().st_size for p in source.path.glob("*.bin"))
    dtype = str(_model_config(source).get("torch_dtype", "float32"))
    per_param = 2 if dtype in ("bfloat16", "float16") else 4
    return weights * 3 * 4 // per_param


# ----- task ------------------------------------------------------------------------------
def check_data(cfg: RunConfig) -> str:
    """The task's data, the evaluation set and every reward load (one owner:
    grpo_stream.preflight.data; a dataset is opened memory-mapped, nothing is trained)."""
    try:
        columns = check_task_data(cfg)
    except DataCheckError as exc:
        raise PreflightError(str(exc)) from None
    if not columns:
        return f"data: task {cfg.task.name} is generated, no file"
    source = cfg.task.dataset or cfg.task.path
    return f"data: {source} has the columns {', '.join(columns)}"


def check_fit(cfg: RunConfig, source: ModelSource | None) -> str:
    """The longest of the first prompts, plus generator.max_tokens, fits the model's context."""
    context = context_length(source)
    longest = None if context is None else longest_prompt(cfg, source)
    if context is None or longest is None:
        return "fit: skipped (the model's config or tokenizer.json is not here)"
    need = longest + cfg.generator.max_tokens
    template = " before its chat template" if cfg.task.chat_template else ""
    if need > context:
        raise PreflightError(
            f"prompts do not fit the model: the longest of the first {FIT_PROBLEMS} "
            f"{cfg.task.name} prompts is {longest} tokens{template}, + generator.max_tokens "
            f"{cfg.generator.max_tokens} = {need} > {context}, the context of "
            f"{cfg.model.name_or_path}: choose a model with a longer context "
            "(model.name_or_path), shorter prompts (task.*) or fewer generator.max_tokens"
        )
    return f"fit: longest prompt {longest}{template} + max_tokens {need - longest} <= {context}"


def longest_prompt(cfg: RunConfig, source: ModelSource | None) -> int | None:
    """Tokens of the longest of the first `FIT_PROBLEMS` prompts before any chat template (a
    lower bound); None when the model's tokenizer.json is not here."""
    tokenizer_file = source.path / "tokenizer.json" if source and source.path else None
    if tokenizer_file is None or not tokenizer_file.is_file():
        return None
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    raw = cfg.task.model_copy(update={"chat_template": False})  # a lower bound: no template
    try:
        task = make_task(raw)
        prompts = [task.problem(i).prompt for i in range(FIT_PROBLEMS)]
    except (TaskDataError, ValueError) as exc:
        raise PreflightError(str(exc)) from None
    return max(len(tokenizer.encode(p).ids) for p in prompts)


def check_context(cfg: RunConfig, source: ModelSource | None) -> str:
    """trainer.context_parallel divides the model's attention heads (Ulysses gives each rank
    heads / N of them) and the run's longest sequence has a token for every rank."""
    degree = cfg.trainer.context_parallel
    config = _model_config(source)
    heads = config.get("num_attention_heads", config.get("n_head"))
    if isinstance(heads, int):
        try:
            check_context_heads(degree, heads, cfg.model.name_or_path)
        except ValueError as exc:
            raise PreflightError(str(exc)) from None
    prompt = longest_prompt(cfg, source) or 1  # a prompt has a token at least
    longest = prompt + cfg.generator.max_tokens
    if longest < degree:
        raise PreflightError(
            f"trainer.context_parallel = {degree} splits each sequence over {degree} ranks, "
            f"but this run's longest sequence is {longest} tokens (prompt {prompt} + "
            f"generator.max_tokens {cfg.generator.max_tokens}): lower "
            "trainer.context_parallel or raise generator.max_tokens"
        )
    seen = f"{heads} heads" if isinstance(heads, int) else "heads checked at start"
    return f"context parallel: {degree} ranks a sequence ({seen}, longest {longest} tokens)"


def check_compatible(cfg: RunConfig, source: ModelSource | None) -> str:
    """A chat template where the task asks for one; vLLM installed where the engine names it."""
    if cfg.generator.engine == "vllm":
        check_vllm()
    if cfg.task.chat_template and source is not None and source.path is not None:
        tok_cfg = source.path / "tokenizer_config.json"
        data = json.loads(tok_cfg.read_text()) if tok_cfg.is_file() else {}
        has = "chat_template" in data or (source.path / "chat_template.jinja").is_file()
        if not has:
            raise PreflightError(
                f"task.chat_template = true but {cfg.model.name_or_path} has no chat "
                "template: set task.chat_template = false or use an instruct model"
            )
    return f"compatible: engine {cfg.generator.engine}, chat_template {cfg.task.chat_template}"


def check_vllm() -> None:
    """vLLM installed here, and a release the vllm engine supports (read from its package
    metadata: vLLM is not imported; the engine checks its API again at start)."""
    version = vllm_compat.installed_version()
    if util.find_spec("vllm") is None or version is None:
        raise PreflightError(
            "generator.engine = 'vllm' but vLLM is not installed here: see "
            "docs/guide/vllm.md (GPU and CPU hosts), or set generator.engine = 'hf'"
        )
    try:
        vllm_compat.check_version(version)
    except vllm_compat.UnsupportedVLLM as exc:
        raise PreflightError(str(exc)) from None


def check_teacher(cfg: RunConfig, policy: ModelSource | None, local_model: bool) -> str:
    """The distillation teacher resolves, its engine is installed, and it reads token ids as
    the policy does (the same vocabulary: teachers score the policy's ids as they are)."""
    name = str(cfg.algo.distill.teacher)
    teacher = find_model(
        name, ask_hub=local_model, required=local_model, setting="algo.distill.teacher"
    )
    if cfg.teacher.engine == "vllm" and util.find_spec("vllm") is None:
        raise PreflightError(
            "teacher.engine = 'vllm' but vLLM is not installed here: set teacher.engine = 'hf'"
        )
    mine, theirs = _vocab(policy), _vocab(teacher)
    if mine is None or theirs is None:
        return f"teacher: {name} (vocabulary not compared: a tokenizer.json is not here)"
    if mine != theirs:
        differ = len(set(mine.items()) ^ set(theirs.items()))
        raise PreflightError(
            f"algo.distill.teacher: {name} does not share the vocabulary of "
            f"{cfg.model.name_or_path} ({len(theirs)} vs {len(mine)} tokens, {differ} "
            "entries differ): the teacher scores the policy's token ids, so it needs the "
            "same tokenizer"
        )
    return f"teacher: {name} ({teacher.where if teacher else 'not here'}), same vocabulary"


def _vocab(source: ModelSource | None) -> dict[str, int] | None:
    path = source.path / "tokenizer.json" if source and source.path else None
    if path is None or not path.is_file():
        return None
    from tokenizers import Tokenizer

    vocab: dict[str, int] = Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)
    return vocab


def check_agent(cfg: RunConfig) -> str:
    """env.agent: the server and client libraries are installed, the function loads and
    is async (the generator's agent workers load it again, sandboxed)."""
    if cfg.env.agent is None:
        return "agent: none"
    needed = ["starlette", "uvicorn"] + (["openai"] if cfg.env.agent_client == "openai" else [])
    missing = [name for name in needed if util.find_spec(name) is None]
    if missing:
        raise PreflightError(
            f"env.agent needs {', '.join(missing)}: pip install 'grpo-stream[agents]'"
        )
    try:
        load_agent(cfg.env.agent)
    except ValueError as exc:
        raise PreflightError(str(exc)) from None
    return f"agent: {cfg.env.agent} (client {cfg.env.agent_client})"


# ----- run directory ---------------------------------------------------------------------
def check_run_dir(run_dir: Path, need_bytes: int) -> str:
    """The run directory (or its nearest existing parent) is writable with room to spare."""
    if run_dir.exists() and not run_dir.is_dir():
        raise PreflightError(f"run.run_dir: {run_dir} exists and is not a directory")
    base = run_dir
    while not base.exists():
        base = base.parent if base.parent != base else Path(".")
    if not os.access(base, os.W_OK | os.X_OK):
        raise PreflightError(f"run.run_dir: {run_dir}: {base} is not writable (--run-dir)")
    free = shutil.disk_usage(base).free
    if free < need_bytes:
        raise PreflightError(
            f"run.run_dir: {run_dir}: {free / 2**20:.0f} MiB free, a checkpoint needs about "
            f"{need_bytes / 2**20:.0f} MiB: free space or choose another --run-dir"
        )
    return f"run dir: {run_dir} writable, {free / 2**30:.1f} GiB free"
