"""What an authenticated generator's Rollout may carry: checks of content, not only form,
before the hub scores or trains anything of it.

An authenticated generator is trusted to sample, not to say what is trained: the hub checks
that a Rollout
- comes from the generator the lease was issued to (`LeaseBook.issued_to`), names that
  generator, and was sampled as leased (`SamplingParams` as dispatched);
- has numbers a sampler can produce (`guard.check_numbers`: log-probs finite and <= 0);
- has every token id inside the model's vocabulary (one id past it crashed the trainer);
- has the prompt ids of the prompt the hub leased for that group (the hub tokenizes its own
  prompt as the hf engine does), episodes included;
- single-turn: texts that are the decoding of its completion ids (as both engines decode
  them: special tokens skipped), so the scorer scores exactly what the trainer trains.
The scorer gets the task's own prompt and reference, never a generator's (a Rollout carries
neither). Whether a rollout is an episode is the run's config's to say (`env`), never the
message's. An episode's policy turns are decoded by the hub itself and its environment turns
checked against a scorer's replay (`grpo_stream.hub.transcript`).

Invariant: a Rollout that fails a check changes nothing (`check` returns why; the grouper
refuses it with one error event and the lease is re-dispatched).
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np

from grpo_stream.config import RunConfig
from grpo_stream.hub.dispatch import sampling_params
from grpo_stream.hub.guard import check_numbers
from grpo_stream.models.loading import load_tokenizer, vocab_size
from grpo_stream.protocols import messages as m
from grpo_stream.tasks import Task


class ContentCheck:
    """The hub's content checks of Rollouts (see the module docstring)."""

    def __init__(
        self,
        tokenizer: Any,
        vocab: int,
        task: Task,
        sampling: m.SamplingParams,
        episodes: bool = False,
        agent: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab = vocab
        self.task = task
        self.sampling = sampling
        self.episodes = episodes  # the run plays episodes (env): from its config alone
        self.agent = agent  # ... played by an agent: its prompt is the agent's own

    @classmethod
    def load(cls, cfg: RunConfig, task: Task, tokenizer: Any = None) -> ContentCheck:
        """From the run's model (its tokenizer, unless given, and config)."""
        tok = tokenizer if tokenizer is not None else load_tokenizer(cfg.model.name_or_path)
        vocab = vocab_size(cfg.model.name_or_path)
        env = cfg.env
        sampling = sampling_params(cfg.generator)
        return cls(tok, vocab, task, sampling, env.enabled, agent=env.agent is not None)

    def check(self, msg: m.Rollout, sender: str) -> str | None:
        """None if `msg` may be scored and trained; else why not."""
        where = f"rollout of group {msg.group_id}"
        if msg.instance != sender:
            return f"{where}: says it is from {msg.instance!r}, sent by {sender!r}"
        if msg.sampling != self.sampling:
            return f"{where}: sampled with {msg.sampling}, leased with {self.sampling}"
        numbers = check_numbers(msg)
        if numbers is not None:
            return numbers
        for name, ids in (("prompt_ids", msg.prompt_ids), ("completion_ids", msg.completion_ids)):
            arr = np.asarray(ids)
            if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= self.vocab):
                bad = int(arr.max()) if int(arr.max()) >= self.vocab else int(arr.min())
                vocab = f"[0, {self.vocab})"
                return f"{where}: {name} holds token id {bad}, outside the vocabulary {vocab}"
        if self.agent:
            return None  # an agent's episodes trust the generator (docs/guide/security.md)
        prompt = self.task.problem(msg.group_id).prompt
        want: list[int] = self.tokenizer(prompt)["input_ids"]
        if np.asarray(msg.prompt_ids).tolist() != list(want):
            return f"{where}: prompt_ids are not the tokens of the prompt leased for it"
        if self.episodes:
            return None  # its turns: decoded by the hub, replayed by a scorer (hub.transcript)
        return self._text(msg, where)

    def _text(self, msg: m.Rollout, where: str) -> str | None:
        offsets = np.asarray(msg.completion_offsets).tolist()
        ids = np.asarray(msg.completion_ids).tolist()
        rows = [ids[lo:hi] for lo, hi in pairwise(offsets)]
        texts = self.tokenizer.batch_decode(rows, skip_special_tokens=True)
        for i, (text, decoded) in enumerate(zip(msg.texts, texts, strict=True)):
            if text != decoded:
                return f"{where}: text {i} is not the decoding of its token ids"
        return None
