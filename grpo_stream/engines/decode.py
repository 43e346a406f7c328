"""The hf engine's decode loop: a hand-written KV-cache sampler that can swap weights in flight.

Invariants:
- Step s samples token s of every row from `softmax(logits / temperature)` (optionally within
  the nucleus `top_p`) and reports `log_softmax(logits / temperature)` of it in fp32, before
  nucleus truncation.
- `Decoded.step_versions[s]` is the weights version whose forward pass gave step s's logits.
- With `repeats` = G each of the P input rows is prefilled once and its cache and last logits
  are repeated G times (row p*G + g of the output is sample g of input row p); the B = P*G
  rows then decode as one batch. Rows of a forward pass do not see each other, so this gives
  what prefilling all P*G rows gives, up to the float rounding of another batch size.
- Between two steps `between_steps` may swap a new version into the model (in-flight update).
  With `keep_kv` the KV cache of the tokens so far is kept (PipelineRL): the next step's logits
  come from the new weights attending to keys/values of the old ones, so its log-prob is the
  exact probability the token was sampled with, but not what a fresh forward of either version
  gives. Without it the rows so far are prefilled again under the new weights: every token's
  log-prob is then that of a fresh forward of the version that sampled it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from grpo_stream.sampling import Sampling

if TYPE_CHECKING:
    import torch


Step = tuple["torch.Tensor", dict[str, Any], "torch.Tensor"]
"""What a step continues from: last logits (B, V), the cache by keyword, next positions."""


@dataclass
class Decoded:
    """What one decode loop sampled: (B, N) tokens and log-probs, N <= Sampling.max_tokens."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    lengths: torch.Tensor
    """(B,) tokens of each row up to and including its first end-of-sequence token."""
    step_versions: list[int]
    """The weights version that gave each step's logits (len N)."""


@dataclass
class Decoder:
    """The loop's fixed parts: the model, how its forward names the cache, the stop tokens."""

    model: Any
    cache_arg: str
    eos_ids: set[int]

    def run(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        sampling: Sampling,
        version: Callable[[], int],
        between_steps: Callable[[], None] | None = None,
        keep_kv: bool = False,
        repeats: int = 1,
    ) -> Decoded:
        """Sample up to `sampling.max_tokens` steps from left-padded `input_ids` (P, T) under
        `mask`, `repeats` samples of each row (B = P * repeats output rows, a row's samples
        adjacent). `version()` is the version the model holds now; `between_steps` may change
        it."""

        out, cache, next_pos = self._prefill(input_ids, mask)
        logits = out.logits[:, -1, :]  # (P, V)
        if repeats > 1:  # one prefill per distinct row, its cache shared by its samples
            cache[self.cache_arg].batch_repeat_interleave(repeats)
            logits, next_pos, input_ids, mask = (
                t.repeat_interleave(repeats, dim=0) for t in (logits, next_pos, input_ids, mask)
            )

        swap = (
            None
            if between_steps is None
            else self._swap(input_ids, version, between_steps, keep_kv)
        )
        got, _ = self.steps(logits, cache, mask, next_pos, sampling, version, swap)
        return got

    def _swap(
        self,
        input_ids: torch.Tensor,
        version: Callable[[], int],
        between_steps: Callable[[], None],
        keep_kv: bool,
    ) -> Callable[[list[torch.Tensor], torch.Tensor], Step | None]:
        """`steps`' in-flight hook: run `between_steps` (it may swap in a new version); on a
        new version without `keep_kv`, prefill the rows so far again under it."""
        import torch

        def swap(tokens: list[torch.Tensor], mask: torch.Tensor) -> Step | None:
            before = version()
            between_steps()
            if version() == before or keep_kv:
                return None
            rows = torch.cat([input_ids, torch.stack(tokens, dim=1)], dim=-1)
            out, cache, next_pos = self._prefill(rows, mask)
            return out.logits[:, -1, :], cache, next_pos

        return swap

    def steps(
        self,
        logits: torch.Tensor,
        cache: dict[str, Any],
        mask: torch.Tensor,
        next_pos: torch.Tensor,
        sampling: Sampling,
        version: Callable[[], int],
        swap: Callable[[list[torch.Tensor], torch.Tensor], Step | None] | None = None,
    ) -> tuple[Decoded, torch.Tensor]:
        """The sampling steps from the last logits (B, V) of rows whose KV is in `cache`
        (keyword name -> cache) under `mask` (B, T), next positions `next_pos` (B, 1): up to
        `sampling.max_tokens` tokens per row, drawn from a private generator seeded with
        `sampling.seed` (torch's global one when None), a row done at its first end-of-sequence
        token. Between two
        steps `swap(tokens so far, mask)` may change the weights and return a fresh
        (logits, cache, next positions) for them. Returns what was sampled and the mask over
        the cache at the end (the last token sampled never runs through the model)."""
        import torch

        batch, device = logits.shape[0], logits.device
        max_tokens, temperature = sampling.max_tokens, sampling.temperature
        generator = seeded(sampling.seed, device)
        eos = torch.tensor(sorted(self.eos_ids), device=device)
        held = version()
        lengths = torch.full((batch,), max_tokens, dtype=torch.long, device=device)
        finished = torch.zeros(batch, dtype=torch.bool, device=device)
        tokens: list[torch.Tensor] = []
        logprobs: list[torch.Tensor] = []
        step_versions: list[int] = []
        for step in range(max_tokens):
            logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # (B, V)
            tok = draw(logp, sampling.top_p, generator)  # (B,)
            tokens.append(tok)
            logprobs.append(logp.gather(-1, tok[:, None])[:, 0])
            step_versions.append(held)
            ended = ~finished & torch.isin(tok, eos)
            lengths[ended] = step + 1
            finished |= ended
            if step == max_tokens - 1 or bool(finished.all()):
                break
            mask = torch.cat([mask, mask.new_ones((batch, 1))], dim=-1)
            fresh = None if swap is None else swap(tokens, mask)
            held = version()
            if fresh is not None:
                logits, cache, next_pos = fresh
                continue
            out = self.model(
                input_ids=tok[:, None],
                attention_mask=mask,
                position_ids=next_pos,
                use_cache=True,
                **cache,
            )
            logits = out.logits[:, -1, :]
            next_pos = next_pos + 1
        got = Decoded(
            torch.stack(tokens, dim=1), torch.stack(logprobs, dim=1), lengths, step_versions
        )
        return got, mask

    def _prefill(
        self, input_ids: torch.Tensor, mask: torch.Tensor
    ) -> tuple[Any, dict[str, Any], torch.Tensor]:
        """A fresh cache filled by one forward of the rows: (output, cache, next positions)."""
        from transformers import DynamicCache

        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, T): pad-independent positions
        cache = {self.cache_arg: DynamicCache()}  # filled in place by every forward
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **cache,
        )
        return out, cache, positions[:, -1:] + 1


def version_runs(step_versions: list[int], length: int) -> list[tuple[int, int]]:
    """(first token index, version) for each run of equal versions over the first `length`."""
    runs: list[tuple[int, int]] = []
    for i, v in enumerate(step_versions[:length]):
        if not runs or runs[-1][1] != v:
            runs.append((i, v))
    return runs


def seeded(seed: int | None, device: torch.device) -> torch.Generator | None:
    """A private generator on `device` seeded with `seed` (None: torch's global one)."""
    import torch

    return None if seed is None else torch.Generator(device=device).manual_seed(seed)


def draw(logp: torch.Tensor, top_p: float, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from the tempered distribution, within the nucleus `top_p`."""
    import torch

    probs = logp.exp()  # (B, V)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        outside = (sorted_p.cumsum(-1) - sorted_p) >= top_p
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows left-padded with `pad_id` to the longest, and their attention mask (1 on a
    row's own tokens), both (B, T) long on the CPU."""
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # (B, T)
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # (B, T)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        mask[i, width - len(row) :] = 1
    return ids, mask
