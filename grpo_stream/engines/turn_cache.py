"""The hf engine's KV cache kept between the turns of one batch of episodes.

`HFEngine.open_turns` opens a `TurnCache` per batch of episodes (`grpo_stream.envs.episodes`);
each `complete(keys, rows, sampling)` samples one continuation per row exactly as
`HFEngine.complete` does, but feeds the model only the tokens of each row that the cache does
not hold yet: the environment's observation and the last sampled token of the previous turn
(the decode loop samples it but never runs it through the model). `close` frees the cache.

Layout: one batched `DynamicCache` of B rows x L columns and its attention mask (B, L). The
columns of row i with mask 1 hold, in order, the keys/values of exactly `_ids[i]`; columns with
mask 0 are holes: the left padding of a turn's chunk (rows add different numbers of tokens),
tokens sampled after a row's end of sequence. A token's position is the number of valid
tokens before it (`mask.cumsum(-1) - 1`, as in a fresh left-padded prefill), so a row's
numbers do not depend on its holes: what the model computes for a row is a fresh forward of
that row, up to float summation order (tested to 1e-5 against one).

Rows that are equal so far, with equal holes, have equal cache rows: the G episodes of a
prompt on the first turn, and episodes that have played alike since (a confident policy
often does). Each such set is fed once and its cache row repeated (`batch_select_indices`).

Invariants:
- a row must extend what the cache holds for its key (checked); a key absent from a call is
  an episode that ended: its cache row is dropped (`batch_select_indices`);
- the cache is used only under the weights version that filled it: a new version, a key not
  seen before, a row that does not extend its cached ids, or a model with sliding-window
  layers (holes would shift its window) drop the cache, and every row is prefilled whole;
- sampling is `engines.decode.draw` on `log_softmax(logits / temperature)` with a private
  generator seeded per call, so with equal logits a call samples what `complete` samples.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from grpo_stream.engines.base import check_rows
from grpo_stream.engines.decode import Decoded, Decoder, left_pad
from grpo_stream.sampling import Completion, Sampling

if TYPE_CHECKING:
    import torch

log = structlog.get_logger()


@dataclass
class TurnCache:
    """One batch of episodes' KV cache between turns (see the module docstring)."""

    decoder: Decoder
    pad_id: int
    device: torch.device
    version: Callable[[], int]
    """The weights version the model holds now."""
    finish: Callable[[Decoded, int], list[Completion]]
    """Decoded rows -> Completions (the engine's: text, truncated flag, version runs)."""
    prefilled: int = 0
    """Tokens fed to the model outside the decode steps, over the cache's life."""
    _keys: list[int] = field(default_factory=list)
    _ids: list[list[int]] = field(default_factory=list)
    _cache: Any = None
    _mask: torch.Tensor | None = None  # (B, L)
    _held: int = -1
    _sliding: bool = False

    def complete(
        self, keys: list[int], rows: list[list[int]], sampling: Sampling
    ) -> list[Completion]:
        """One continuation of at most `sampling.max_tokens` tokens per row (the whole row so
        far: prompt and every turn), row i being episode `keys[i]`."""
        import torch

        _check(keys, rows)
        with torch.inference_mode():
            if not self._reusable(keys, rows):
                self._reset(len(rows))
            else:
                self._select(keys)
            self._keys = list(keys)
            logits, next_pos = self._extend(rows)
            got = self._decode(logits, next_pos, sampling)
        return self.finish(got, sampling.max_tokens)

    @property
    def rows(self) -> int:
        """Episodes the cache holds now (0 when closed or not yet filled)."""
        return 0 if self._mask is None else int(self._mask.shape[0])

    def close(self) -> None:
        """Free the cache (the session may be used again: it then starts empty)."""
        self._keys, self._ids, self._cache, self._mask = [], [], None, None

    # ---- the cache --------------------------------------------------------------------

    def _reusable(self, keys: list[int], rows: list[list[int]]) -> bool:
        if self._cache is None or self._sliding:
            return False
        if self.version() != self._held:
            log.info(
                "turns.cache_dropped",
                reason="weights changed",
                held=self._held,
                version=self.version(),
            )
            return False
        where = {k: i for i, k in enumerate(self._keys)}
        for k, row in zip(keys, rows, strict=True):
            i = where.get(k)
            if i is None or row[: len(self._ids[i])] != self._ids[i]:
                reason = "new episode" if i is None else "row does not extend the cache"
                log.info("turns.cache_dropped", reason=reason, key=k)
                return False
        return True

    def _reset(self, batch: int) -> None:
        import torch
        from transformers import DynamicCache

        self._cache = DynamicCache()
        self._mask = torch.zeros((batch, 0), dtype=torch.long, device=self.device)
        self._ids = [[] for _ in range(batch)]
        self._held = self.version()

    def _select(self, keys: list[int]) -> None:
        """Keep the rows of `keys`, in that order (the others' episodes ended)."""
        import torch

        where = {k: i for i, k in enumerate(self._keys)}
        order = [where[k] for k in keys]
        if order != list(range(len(self._keys))):
            index = torch.tensor(order, dtype=torch.long, device=self.device)
            self._cache.batch_select_indices(index)
            self._mask = self._mask_now()[index]
            self._ids = [self._ids[i] for i in order]

    def _extend(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed each row's uncached tail, left-padded to the widest: (last logits (B, V),
        next positions (B, 1)). Rows equal so far (the G episodes of a prompt on the first
        turn, episodes that played alike since) are fed once and their cache row repeated."""
        import torch

        mask = self._mask_now()
        for i, row in enumerate(rows):
            if len(row) == len(self._ids[i]):  # nothing new: run the last token again
                last = int(mask[i].nonzero()[-1])
                mask[i, last] = 0
                self._ids[i] = self._ids[i][:-1]
        tails = [row[len(ids) :] for row, ids in zip(rows, self._ids, strict=True)]
        self._ids = [ids + tail for ids, tail in zip(self._ids, tails, strict=True)]
        # Equal ids and equal holes: equal cache rows, so equal rows after this chunk too.
        layouts = mask.cpu().numpy()
        same: dict[tuple[tuple[int, ...], bytes], int] = {}
        first = [
            same.setdefault((tuple(ids), layouts[i].tobytes()), i)
            for i, ids in enumerate(self._ids)
        ]
        if len(same) == len(rows):
            logits, positions, self._mask = self._feed(tails, mask)
        else:
            distinct = list(same.values())
            where = {row: j for j, row in enumerate(distinct)}
            keep = torch.tensor(distinct, dtype=torch.long, device=self.device)
            self._cache.batch_select_indices(keep)
            logits, positions, fed = self._feed([tails[i] for i in distinct], mask[keep])
            index = torch.tensor([where[f] for f in first], dtype=torch.long, device=self.device)
            self._cache.batch_select_indices(index)
            logits, positions, self._mask = logits[index], positions[index], fed[index]
        self._sliding = any(self._cache.is_sliding)
        return logits, positions[:, -1:] + 1

    def _feed(
        self, tails: list[list[int]], mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One forward of `tails` (left-padded) after the cache's (n, L) `mask`: (last
        logits (n, V), the chunk's positions (n, W), the mask with the chunk (n, L + W))."""
        import torch

        chunk, chunk_mask = left_pad(tails, self.pad_id)  # (n, W), (n, W)
        width = chunk.shape[1]
        mask = torch.cat([mask, chunk_mask.to(self.device)], dim=-1)  # (n, L + W)
        positions = (mask.cumsum(-1) - 1)[:, -width:].clamp(min=0)  # (n, W)
        out = self.decoder.model(
            input_ids=chunk.to(self.device),
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self.decoder.cache_arg: self._cache},
        )
        self.prefilled += sum(len(t) for t in tails)
        return out.logits[:, -1, :], positions, mask

    def _decode(self, logits: torch.Tensor, next_pos: torch.Tensor, sampling: Sampling) -> Decoded:
        """The decode steps (`Decoder.steps`, no in-flight swaps), then the cache keeps the KV
        of each row's tokens up to its end of sequence; later ones become holes."""
        mask = self._mask_now()
        start = mask.shape[1]
        got, mask = self.decoder.steps(
            logits,
            {self.decoder.cache_arg: self._cache},
            mask,
            next_pos,
            sampling,
            lambda: self._held,
        )
        self._keep_decoded(mask, start, got)
        return got

    def _keep_decoded(self, mask: torch.Tensor, start: int, got: Decoded) -> None:
        """Columns start.. hold the KV of decoded tokens 0..S-2: keep those up to each row's
        end of sequence, mask out the rest."""
        cached = mask.shape[1] - start  # S - 1 tokens ran through the model
        tok_rows: list[list[int]] = got.tokens[:, :cached].cpu().tolist()
        for i, n in enumerate(got.lengths.cpu().tolist()):
            keep = min(int(n), cached)
            mask[i, start + keep :] = 0
            self._ids[i] = self._ids[i] + tok_rows[i][:keep]
        self._mask = mask

    def _mask_now(self) -> torch.Tensor:
        if self._mask is None:
            raise RuntimeError("the turn cache is closed")
        return self._mask


def _check(keys: list[int], rows: list[list[int]]) -> None:
    check_rows(rows)
    if len(keys) != len(rows) or len(set(keys)) != len(keys):
        raise ValueError("complete needs one distinct key per row")
