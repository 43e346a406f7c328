"""Weight sync inside vLLM's worker processes: `LLM(worker_extension_cls=...)` mixes
`WeightSyncExtension` into each worker, and the engine calls its methods through
`llm.collective_rpc(name, args=...)`.

Invariants:
- Weights never travel as RPC arguments (vLLM would serialise tensors to lists): the worker
  fetches them itself from the trainer's weight server over ZeroMQ, or reads a safetensors
  file the engine wrote. RPC arguments are plain str/int/dict.
- Names are Hugging Face parameter names; vLLM's model maps them onto its fused layers
  (qkv_proj, gate_up_proj). For a tied model `lm_head.weight` is always applied, last and
  with the embedding's values (see `_with_tied_head`): never a stale duplicate.
- A version is fetched completely before any parameter is written; the engine resets the
  prefix cache after every update, so no KV block computed with old weights is reused.

Nothing here imports vLLM; vLLM imports this module inside its worker processes.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    import torch

    from grpo_stream.transport.fetch import Replica

log = structlog.get_logger()

_REPLICAS: dict[str, Replica] = {}
"""This worker process's copy of the version it applied last (the base of deltas), by key
"held" (one per process; created on the first fetch)."""
TIED_NAME = "lm_head.weight"
EMBED_NAMES = ("model.embed_tokens.weight", "transformer.wte.weight")
"""Input-embedding names (Qwen2/Llama/Mistral style, GPT style) a tied lm_head follows."""


class WeightSyncExtension:
    """Methods that run inside each vLLM worker (`self` is vLLM's Worker)."""

    # Provided by vLLM's Worker (annotations only: vLLM refuses an extension whose
    # attributes clash with the worker's).
    model_runner: Any
    vllm_config: Any
    reload_weights: Any

    def update_from_server(
        self, address: str, version: int, transport: dict[str, Any], security: dict[str, Any]
    ) -> int:
        """Fetch `version` (-1: newest) from the weight server and apply it; the version got."""
        import zmq

        from grpo_stream.engines.base import to_torch
        from grpo_stream.transport.settings import SecuritySettings, TransportSettings

        ctx: zmq.Context[Any] = zmq.Context()
        from grpo_stream.transport.fetch import Replica

        replica = _REPLICAS.setdefault("held", Replica())  # deltas are sent against it
        try:
            got = replica.fetch(
                ctx,
                address,
                TransportSettings.model_validate(transport),
                SecuritySettings.model_validate(security),
                version=version,
            )
        finally:
            ctx.destroy(linger=0)
        self._apply_weights([(name, to_torch(arr)) for name, arr in replica.named()])
        return got

    def load_weights_file(self, path: str) -> int:
        """Apply the tensors of a safetensors file; returns how many were applied."""
        from safetensors.torch import load_file

        return self._apply_weights(list(load_file(path).items()))

    def _apply_weights(self, items: list[tuple[str, torch.Tensor]]) -> int:
        start = time.perf_counter()
        if self.vllm_config.model_config.hf_text_config.tie_word_embeddings:
            items = _with_tied_head(items)
        via = "reload_weights" if _on_cpu() else "load_weights"
        if via == "load_weights":
            try:
                self.model_runner.get_model().load_weights(weights=iter(items))
            except (AttributeError, AssertionError) as exc:
                # Backends that repack weights after loading leave parameters that the
                # model's loaders no longer accept (no weight_loader, or a repacked shape).
                log.info("vllm_worker.load_weights_fallback", reason=str(exc))
                via = "reload_weights"
        if via == "reload_weights":
            # The worker's in-place reload redoes load-and-repack for the whole model.
            self.reload_weights(
                weights_iterator=iter(items), weights_path=None, is_checkpoint_format=True
            )
        log.info(
            "vllm_worker.weights_applied",
            tensors=len(items),
            via=via,
            seconds=round(time.perf_counter() - start, 4),
        )
        return len(items)


def _on_cpu() -> bool:
    """vLLM's CPU backend repacks linear weights, so model.load_weights cannot update them."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def _with_tied_head(items: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
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
