"""The inference-engine interface that generators call (built by `engines.factory`).

Conventions every engine keeps (the trainer relies on them; `Completion` and `GroupSample`
live on the ground floor, `grpo_stream.sampling`, so agents and environments share them):

- `GroupSample.prompt_ids` are the prompt's token ids exactly as the engine fed them to the
  model (the tokenizer's special tokens included, no padding).
- `Completion.token_ids` are the sampled tokens, without padding, and include the end-of-
  sequence token when one was sampled (it is the last token then). The trainer trains on
  exactly `prompt_ids + token_ids`.
- `Completion.logprobs[i]` is the behaviour log-probability of `token_ids[i]` under the
  tempered distribution `log_softmax(logits / temperature)` of the weights version the
  engine held when it sampled; `len(logprobs) == len(token_ids)`.
- `Completion.truncated` is true when the completion hit `max_tokens` without an
  end-of-sequence token.
- `generate` returns one `GroupSample` per prompt, in prompt order, each with exactly
  `group_size` completions.
- Weights change only as a complete version: a version is validated in full before any
  parameter is written, so it is never half-applied. They change between `generate` calls,
  and with in-flight updates (hf: `enable_inflight`) also between decoding steps; then
  `Completion.version_runs` says which version sampled which tokens, and `logprobs[i]` is
  under the version that sampled token i.

Importing this module (or `grpo_stream.engines`) imports neither torch nor vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from grpo_stream.protocols.arrays import to_torch as array_to_torch
from grpo_stream.sampling import GroupSample, Sampling

if TYPE_CHECKING:
    import numpy as np
    import torch


class EngineUnavailableError(RuntimeError):
    """The requested engine cannot run here (for instance vLLM is not installed)."""


@runtime_checkable
class Engine(Protocol):
    """What a generator needs from an inference engine."""

    @property
    def version(self) -> int:
        """The weights version the engine holds (0 for the initial weights)."""
        ...

    def generate(
        self, prompts: list[str], group_size: int, sampling: Sampling
    ) -> list[GroupSample]:
        """Sample `group_size` completions per prompt; deterministic for a given
        `sampling.seed`."""
        ...

    def load_weights(
        self, named: Iterable[tuple[str, torch.Tensor | np.ndarray]], version: int
    ) -> None:
        """Apply a complete weights version in place (Hugging Face parameter names)."""
        ...

    def update_from_server(self, address: str, version: int) -> int:
        """Fetch `version` (-1: the newest) from the trainer's weight server and apply it.

        Returns the version applied.
        """
        ...

    def close(self) -> None:
        """Release the model and any sockets."""
        ...


@runtime_checkable
class Capacity(Protocol):
    """An engine that runs a bounded number of sequences at once (vllm: its scheduler's
    max_num_seqs and KV cache); the generator's credits follow it."""

    def capacity(self, max_tokens: int) -> int:
        """Sequences of at most `max_tokens` completion tokens the engine runs at once."""
        ...


def check_generate(prompts: list[str], group_size: int) -> None:
    """`Engine.generate`'s arguments: at least one prompt and one completion each."""
    if not prompts:
        raise ValueError("generate needs at least one prompt")
    if group_size < 1:
        raise ValueError("group_size must be at least 1")


def check_rows(rows: list[list[int]]) -> None:
    """A `complete` call's rows: at least one, none empty (each continues its last token)."""
    if not rows or any(not r for r in rows):
        raise ValueError("complete needs non-empty rows of token ids")


def to_torch(value: torch.Tensor | np.ndarray) -> torch.Tensor:
    """A torch tensor for a received array (ml_dtypes bfloat16 included); tensors pass through."""
    import torch

    if isinstance(value, torch.Tensor):
        return value
    tensor: torch.Tensor = array_to_torch(value)
    return tensor
