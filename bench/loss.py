"""Cost of the full regularized GRPO step against a bare log-prob training step.

Full step: chunked token_logprobs (with grad, entropies under no_grad), grpo_loss, backward,
the rollback guard's finiteness check, the gradient regularizer and an AdamW step; as
`behaviour` (no pi_prox), as `tis` the way the trainer runs it with a deterministic forward
and one update per batch (pi_prox = the with-grad forward's detached log-probs, no extra
forward), and as `tis + pi_prox forward` (one no-grad forward over the batch first: what the
trainer runs with dropout on, and once per batch with trainer.minibatches > 1).
Bare step: model(...).logits -> log_softmax -> gather -> mean, backward, AdamW step; and
bare + forward: the same preceded by one no-grad forward (what any trainer that recomputes
its old log-probs pays). Same model, same batch; repetitions interleaved (rotating which goes
first) so drift in a shared machine's load hits all; medians are reported. The last line has
tis/bare (the trainer's default path) and tis+forward/(bare+forward) (goal <= 1.10).

    python -m bench.loss [--reps 15] [--batch 64] [--tokens 48] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from bench.common import add_smoke, parse
from grpo_stream.algo.logprobs import token_logprobs
from grpo_stream.algo.loss import grpo_loss
from grpo_stream.algo.regularizer import GradRegularizer
from grpo_stream.algo.rollback import RollbackGuard
from grpo_stream.config.algo import LossSettings, RegularizerSettings, RollbackSettings
from grpo_stream.training.batch import Tensors
from grpo_stream.training.offpolicy import proximal_logprobs


def build_model(vocab: int) -> Any:
    from grpo_stream.models.testing import tiny_qwen2

    shape = dict(hidden=128, intermediate=512, layers=5, heads=4, kv_heads=2, positions=128)
    return tiny_qwen2(vocab, seed=0, train=True, **shape)  # float32 parameters


def make_batch(batch: int, tokens: int, vocab: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, tokens), generator=gen)
    attention = torch.ones(batch, tokens, dtype=torch.long)
    completion = torch.zeros(batch, tokens, dtype=torch.bool)
    prompt = tokens // 3
    for i in range(batch):
        end = tokens - (i % 5)  # completions of different lengths, right-padded
        attention[i, end:] = 0
        completion[i, prompt:end] = True
    return {"input_ids": ids, "attention_mask": attention, "completion_mask": completion}


def timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--vocab", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=8)
    add_smoke(parser)
    args = parse(parser, None, ["--reps", "1", "--batch", "4", "--tokens", "8"])
    torch.set_num_threads(args.threads)

    model = build_model(args.vocab)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    data = make_batch(args.batch, args.tokens, args.vocab)
    ids, attention, mask = data["input_ids"], data["attention_mask"], data["completion_mask"]
    gen = torch.Generator().manual_seed(1)
    old_logp = torch.where(mask, -3.4 + 0.1 * torch.randn(mask.shape, generator=gen), 0.0)
    advantages = torch.randn(args.batch, generator=gen)
    loss_settings = LossSettings(logprob_chunk=args.chunk, off_policy="behaviour")
    tis_settings = LossSettings(logprob_chunk=args.chunk, off_policy="tis")
    zeros = torch.zeros(args.batch)
    part = Tensors(ids, attention, mask, old_logp, advantages, zeros, zeros.long())
    regularizer = GradRegularizer(RegularizerSettings())
    guard = RollbackGuard(RollbackSettings())

    def grpo_step(tis: bool = False, forward: bool = False) -> None:
        optimizer.zero_grad(set_to_none=True)
        prox = proximal_logprobs(model, part, args.chunk, 1.0) if forward else None
        settings = tis_settings if tis else loss_settings
        logp, entropy = token_logprobs(model, ids, attention, mask, chunk=args.chunk)
        if tis and prox is None:
            prox = logp.detach()  # the trainer's deterministic one-update path
        loss, _ = grpo_loss(
            logp, old_logp, advantages, mask, settings, trainer_old_logp=prox, entropy=entropy
        )
        loss.backward()  # type: ignore[no-untyped-call]
        if guard.check(loss, params):
            regularizer.apply(params)
            optimizer.step()

    def tis_step() -> None:
        grpo_step(tis=True)

    def tis_forward_step() -> None:
        grpo_step(tis=True, forward=True)

    def bare_forward_step() -> None:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=attention)
        bare_step()

    def bare_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        logits = model(input_ids=ids, attention_mask=attention).logits  # (B, T, V)
        logp = torch.log_softmax(logits[:, :-1], dim=-1)
        loss = -logp.gather(-1, ids[:, 1:, None]).mean()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()

    steps: list[Callable[[], None]] = [
        grpo_step,
        tis_step,
        tis_forward_step,
        bare_step,
        bare_forward_step,
    ]
    for _ in range(2):  # warm-up
        for fn in steps:
            fn()
    times: list[list[float]] = [[] for _ in steps]
    for rep in range(args.reps):
        k = rep % len(steps)
        for i in [*range(k, len(steps)), *range(k)]:
            times[i].append(timed(steps[i]))
    grpo_ms, tis_ms, tis_fwd_ms, bare_ms, bare_fwd_ms = (1e3 * statistics.median(t) for t in times)
    n_params = sum(p.numel() for p in params)
    print(
        f"model {n_params / 1e6:.2f}M params, batch {args.batch}x{args.tokens}, chunk {args.chunk}"
    )
    print(f"bare step (log_softmax mean loss)      {bare_ms:8.1f} ms")
    print(f"bare step + no-grad forward            {bare_fwd_ms:8.1f} ms")
    print(f"grpo step, off_policy=behaviour        {grpo_ms:8.1f} ms")
    print(f"grpo step, off_policy=tis              {tis_ms:8.1f} ms")
    print(f"grpo step, tis + pi_prox forward       {tis_fwd_ms:8.1f} ms")
    print(
        f"ratio behaviour/bare {grpo_ms / bare_ms:.3f}  tis/bare {tis_ms / bare_ms:.3f}  "
        f"tis+forward/(bare+forward) {tis_fwd_ms / bare_fwd_ms:.3f}"
    )


if __name__ == "__main__":
    main()
