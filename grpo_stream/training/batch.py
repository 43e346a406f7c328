"""TrainBatch (flat arrays + offsets) to padded tensors for the update.

Sequences are right-padded to the longest one, one per row (the layout the loss reads); a
micro-batch may also carry its sequences packed several to a row for the forward
(`Packing`, built by grpo_stream.training.packing). Position t of `old_logp` holds the
behaviour log-prob of token t (the generator's log p(x_t | x_<t)), so it lines up with
`token_logprobs`; `completion_mask` is true exactly on the completion tokens the loss covers,
never on prompt or padding tokens, and for episodes never on environment tokens (the
TrainBatch's `loss_mask`): every part of the update (loss, normalisers, metrics, KL) reads
this one mask. `token_advantages` (B, T), when the batch has per-turn advantages, replaces
`advantages` (B,) in the loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from grpo_stream.algo.logprobs import SharedLayout
from grpo_stream.protocols.messages import TrainBatch


@dataclass
class Packing:
    """A micro-batch's sequences packed into rows for the forward."""

    input_ids: torch.Tensor  # (R, W) long, the pad id after a row's last sequence
    position_ids: torch.Tensor  # (R, W) long, restarting at 0 for each sequence; pads 0
    completion_mask: torch.Tensor  # (R, W) bool
    index: torch.Tensor  # (S, T) long: where token t of sequence s sits in the flat (R * W)

    def to(self, device: torch.device | str) -> Packing:
        return Packing(
            self.input_ids.to(device),
            self.position_ids.to(device),
            self.completion_mask.to(device),
            self.index.to(device),
        )


@dataclass
class SharedPrompts(SharedLayout):
    """A micro-batch's sequences split at their prompts for a shared-prompt forward
    (grpo_stream.training.prompts): each distinct prompt once, each completion after it."""

    index: torch.Tensor  # (S, T) long: the completion column of token t, clamped to [0, C)
    rows: bool = False  # run as one row per prompt (algo/grouped.py), else on its KV cache

    def to(self, device: torch.device | str) -> SharedPrompts:
        return SharedPrompts(
            self.prompt_ids.to(device),
            self.prompt_mask.to(device),
            self.prompt_of.to(device),
            self.completion_ids.to(device),
            self.completion_attn.to(device),
            self.index.to(device),
            self.rows,
        )


@dataclass
class Tensors:
    input_ids: torch.Tensor  # (B, T) long
    attention_mask: torch.Tensor  # (B, T) long
    completion_mask: torch.Tensor  # (B, T) bool
    old_logp: torch.Tensor  # (B, T) float32, 0 outside completions
    advantages: torch.Tensor  # (B,) float32
    rewards: torch.Tensor  # (B,) float32
    versions: torch.Tensor  # (B,) long
    packing: Packing | None = None  # the same sequences packed for the forward, if packed
    token_advantages: torch.Tensor | None = None  # (B, T) float32 per-turn advantages, if any
    prompts: SharedPrompts | None = None  # the same sequences split for a shared-prompt forward
    rows: torch.Tensor | None = None  # (B,) long: each row's sequence in the TrainBatch

    @property
    def loss_advantages(self) -> torch.Tensor:
        """What the loss multiplies: (B, T) per-token advantages, else (B,) per sequence."""
        return self.advantages if self.token_advantages is None else self.token_advantages

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def forward_shape(self) -> tuple[int, int]:
        """(rows, width) of the forward: the packed rows when packed, else (B, T)."""
        ids = self.input_ids if self.packing is None else self.packing.input_ids
        return int(ids.shape[0]), int(ids.shape[1])

    def trimmed(self) -> Tensors:
        """All rows, trimmed to the longest sequence among them."""
        return self.slice(0, self.size)

    def to(self, device: torch.device | str) -> Tensors:
        return Tensors(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.completion_mask.to(device),
            self.old_logp.to(device),
            self.advantages.to(device),
            self.rewards.to(device),
            self.versions.to(device),
            None if self.packing is None else self.packing.to(device),
            None if self.token_advantages is None else self.token_advantages.to(device),
            None if self.prompts is None else self.prompts.to(device),
            self.rows,  # stays on the CPU: only the evidence of verified rollouts reads it
        )

    def slice(self, lo: int, hi: int) -> Tensors:
        """Rows lo..hi, trimmed to the longest sequence among them."""
        width = int(self.attention_mask[lo:hi].sum(dim=1).max().item()) if hi > lo else 0
        return Tensors(
            self.input_ids[lo:hi, :width],
            self.attention_mask[lo:hi, :width],
            self.completion_mask[lo:hi, :width],
            self.old_logp[lo:hi, :width],
            self.advantages[lo:hi],
            self.rewards[lo:hi],
            self.versions[lo:hi],
            token_advantages=None
            if self.token_advantages is None
            else self.token_advantages[lo:hi, :width],
            rows=None if self.rows is None else self.rows[lo:hi],
        )

    def select(self, rows: torch.Tensor) -> Tensors:
        return Tensors(
            self.input_ids[rows],
            self.attention_mask[rows],
            self.completion_mask[rows],
            self.old_logp[rows],
            self.advantages[rows],
            self.rewards[rows],
            self.versions[rows],
            token_advantages=None if self.token_advantages is None else self.token_advantages[rows],
            rows=None if self.rows is None else self.rows[rows.cpu()],
        )


def to_tensors(batch: TrainBatch, pad_id: int) -> Tensors:
    offsets = np.asarray(batch.seq_offsets, dtype=np.int64)
    n = len(offsets) - 1
    lengths = offsets[1:] - offsets[:-1]
    width = int(lengths.max()) if n else 0
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    comp = torch.zeros((n, width), dtype=torch.bool)
    old = torch.zeros((n, width), dtype=torch.float32)
    flat_ids = torch.from_numpy(np.asarray(batch.input_ids, dtype=np.int64))
    flat_lp = torch.from_numpy(np.array(batch.behaviour_logprobs, dtype=np.float32))
    flat_mask = _per_token(batch.loss_mask, len(flat_lp), "loss_mask", np.bool_)
    flat_adv = _per_token(batch.token_advantages, len(flat_lp), "token_advantages", np.float32)
    token_adv = None if flat_adv is None else torch.zeros((n, width), dtype=torch.float32)
    prompt_lens = np.asarray(batch.prompt_lens, dtype=np.int64)[:n]
    completion = lengths - prompt_lens
    if (completion < 0).any():
        row = int(np.argmax(completion < 0))
        raise ValueError(f"TrainBatch row {row}: prompt_lens {prompt_lens[row]} > its length")
    if int(completion.sum()) != len(flat_lp):
        raise ValueError(
            f"TrainBatch has {len(flat_lp)} behaviour log-probs for "
            f"{int(completion.sum())} completion tokens"
        )
    # every token's (row, column) at once: row i's tokens fill columns 0 .. length-1, its
    # completion tokens columns prompt_len .. length-1 (one scatter each, not a loop of rows)
    rows = torch.from_numpy(np.repeat(np.arange(n), lengths))
    cols = torch.from_numpy(
        np.arange(int(offsets[-1] - offsets[0])) - np.repeat(offsets[:-1] - offsets[0], lengths)
    )
    ids[rows, cols] = flat_ids[int(offsets[0]) : int(offsets[-1])]
    attn[rows, cols] = 1
    starts = np.cumsum(completion) - completion  # each row's first completion token, flat
    c_rows = torch.from_numpy(np.repeat(np.arange(n), completion))
    c_cols = torch.from_numpy(
        np.arange(len(flat_lp)) - np.repeat(starts, completion) + np.repeat(prompt_lens, completion)
    )
    comp[c_rows, c_cols] = True if flat_mask is None else flat_mask
    old[c_rows, c_cols] = flat_lp
    if token_adv is not None and flat_adv is not None:
        token_adv[c_rows, c_cols] = flat_adv
    return Tensors(
        ids,
        attn,
        comp,
        old,
        torch.from_numpy(np.array(batch.advantages, dtype=np.float32)),
        torch.from_numpy(np.array(batch.rewards, dtype=np.float32)),
        torch.from_numpy(np.array(batch.versions, dtype=np.int64)),
        token_advantages=token_adv,
        rows=torch.arange(n),
    )


def _per_token(values: np.ndarray, n: int, name: str, dtype: type) -> torch.Tensor | None:
    """A per-completion-token TrainBatch array as a tensor; None when it is empty (absent)."""
    if len(values) == 0:
        return None
    if len(values) != n:
        raise ValueError(f"TrainBatch has {len(values)} {name} values for {n} completion tokens")
    return torch.from_numpy(np.array(values, dtype=dtype))
