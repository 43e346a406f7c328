"""vLLM's worker side of a weight update: our weight-transfer backend, `HandoffTransfer`.

vLLM builds it in each worker (engine arg `weight_transfer_config={"backend": "grpo_stream"}`;
the name is registered by our `vllm.general_plugins` entry point, `vllm.plugin.register`) and
the generator's engine drives it through vLLM's own protocol: start, update, finish
(`vllm.compat.transfer`), with generation paused around it.

Invariants:
- Tensors never travel through vLLM's RPC. The generator process fetched the version once
  (deltas, checksums, relays: `grpo_stream.transport.fetch`), checked every name and shape
  against the model, and wrote it to one safetensors hand-off file; `update_info` names the
  file and every tensor it must hold. With tensor parallelism every worker of the generator
  reads that one file (fetched once per generator, read once per worker) and vLLM's loaders
  take each worker's shard.
- A file that does not hold exactly the announced tensors is refused before any weight is
  read into the model.
- The load runs inside vLLM's layerwise-reload bracket (start: `initialize_layerwise_reload`,
  finish: `finalize_layerwise_reload`), as vLLM's own checkpoint-format backends do. A load
  that fails midway leaves the bracket open and the model unusable; the engine stays paused,
  and the next `start_weight_update` first closes that bracket (layers not loaded get their
  previous weights back) and opens a fresh one, so the retry loads a whole version.
- Tied embeddings: `lm_head.weight` is always loaded, last, with the embedding's values
  (`with_tied_head`).

This module imports vLLM: only vLLM (inside its workers) and vLLM's tests import it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import structlog
import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.model_executor.model_loader.reload import (
    finalize_layerwise_reload,
    initialize_layerwise_reload,
)

log = structlog.get_logger()

TIED_NAME = "lm_head.weight"
EMBED_NAMES = ("model.embed_tokens.weight", "transformer.wte.weight")
"""Input-embedding names (Qwen2/Llama/Mistral style, GPT style) a tied lm_head follows."""


class HandoffRefused(ValueError):
    """The hand-off file does not hold exactly the tensors the update announced."""


@dataclass
class HandoffInit(WeightTransferInitInfo):  # type: ignore[misc,unused-ignore]
    """Nothing to set up: the hand-off file is local."""


@dataclass
class HandoffUpdate(WeightTransferUpdateInfo):  # type: ignore[misc,unused-ignore]
    """One whole version: the hand-off file and the names it must hold, in load order."""

    path: str
    names: list[str]
    version: int


class HandoffTransfer(WeightTransferEngine[HandoffInit, HandoffUpdate]):  # type: ignore[misc,unused-ignore]
    """Loads one version per update from the generator's hand-off file (module docstring)."""

    init_info_cls = HandoffInit
    update_info_cls = HandoffUpdate
    supports_draft_weight_update = False
    _open = False  # a layerwise-reload bracket is open (a load failed midway, or in progress)

    def init_transfer_engine(self, init_info: HandoffInit) -> None:
        """Nothing to connect to."""

    def start_weight_update(self) -> None:
        if self._open:  # the last load failed midway: close its bracket before a fresh one
            log.warning("vllm_worker.reload_reopened")
            finalize_layerwise_reload(self.model, self.model_config)
        initialize_layerwise_reload(self.model)
        self._open = True

    def receive_weights(self, update_info: HandoffUpdate) -> None:
        start = time.perf_counter()
        items = read_handoff(update_info.path, update_info.names)
        if self.model_config.hf_text_config.tie_word_embeddings:
            items = with_tied_head(items)
        self.model.load_weights(iter(items))
        seconds = round(time.perf_counter() - start, 4)
        # one per version: an internal, not a line for the console
        log.debug("vllm_worker.weights_received", version=update_info.version, seconds=seconds)

    def finish_weight_update(self) -> None:
        finalize_layerwise_reload(self.model, self.model_config)
        self._open = False

    def shutdown(self) -> None:
        """Nothing held between updates."""


def read_handoff(path: str, names: list[str]) -> list[tuple[str, torch.Tensor]]:
    """The file's tensors in `names` order; HandoffRefused unless it holds exactly `names`."""
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as handle:
        held = set(handle.keys())
        if held != set(names) or len(names) != len(set(names)):
            extra, lacking = sorted(held - set(names)), sorted(set(names) - held)
            raise HandoffRefused(
                f"hand-off file {path} does not match its update: extra {extra[:3]}, "
                f"missing {lacking[:3]}"
            )
        return [(name, handle.get_tensor(name)) for name in names]


def with_tied_head(items: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """Send a tied lm_head explicitly, with the embedding's values, after the embedding.

    Senders drop the tied duplicate (the weight server sends shared storage once). vLLM's
    CPU backend keeps a repacked copy of the lm_head that only a loaded `lm_head.weight`
    refreshes: without it, logits keep the old embedding (measured: log-probs off by 2.3
    after an embedding update). Any `lm_head.weight` sent is replaced by the embedding, so a
    stale duplicate can never overwrite the shared storage.
    """
    named = dict(items)
    embed = next((named[n] for n in EMBED_NAMES if n in named), None)
    if embed is None:
        if TIED_NAME not in named:
            log.warning("vllm_worker.tied_embedding_not_found", names=len(named))
        return items
    named.pop(TIED_NAME, None)
    named[TIED_NAME] = embed
    return list(named.items())
