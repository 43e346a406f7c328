"""Build the tiny judge that ships with grpo-stream: `python -m grpo_stream.builds.judge`.

A generative reward model for the CPU demo of `name = "judge"` rewards: the shipped tiny-arith
policy (same character tokenizer, same Qwen2 shape), fine-tuned to read the judge rubric
`grpo_stream.rewards.judge.DEFAULT_TEMPLATE` filled with an arith problem, an answer and the
task's reference answer (a reference-guided judge),

    "7+5=12|12\\nscore:"  ->  "1<eos>"        "7+5=13|12\\nscore:"  ->  "0<eos>"

and write 1 when the answer is right by exact_match's rule (equal to the reference once
surrounding whitespace is stripped), else 0. Wrong answers are drawn the way a policy errs:
off by a few, any number up to 40, digits doubled or dropped, a stray character, nothing.

Invariants: deterministic for a given seed, torch version and thread count (one seeded
generator, fixed evaluation set); SFT stops at the first evaluation whose greedy verdict
accuracy (first generated token, on a fixed balanced set) reaches `--target`; build_info.json
holds that accuracy measured on the weights as saved and reloaded.

It is an imperfect judge, as judges are: it plateaued at 0.846 on the held-out set (steps
200-650 of a longer build). Right answers are judged right and malformed ones (a stray
character, a digit too many or too few) wrong, but it calls most wrong numbers of the
answer's length right, and an empty answer too: it compares digit strings poorly. Hence the
default target of 0.84.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import torch

from grpo_stream.builds import sft
from grpo_stream.builds.sft import Built, WarmStart, build_main, finish, pad_rows
from grpo_stream.builds.tiny import MAX_OPERAND
from grpo_stream.models.loading import load_policy, load_tokenizer
from grpo_stream.rewards.judge import DEFAULT_TEMPLATE, fill

Example = tuple[str, str, bool]
"""(prompt, completion, whether the completion is right)."""


def wrong_answer(rng: random.Random, answer: int) -> str:
    """An answer a policy could write that exact_match scores 0."""
    kind = rng.randrange(6)
    if kind == 0:
        off = rng.choice([d for d in range(-9, 10) if d != 0 and answer + d >= 0])
        text = str(answer + off)
    elif kind == 1:
        text = str(rng.randrange(0, 2 * MAX_OPERAND + 1))
    elif kind == 2:
        digits = str(answer)
        text = digits + digits[-1]  # a digit doubled
    elif kind == 3:
        text = str(answer)[:-1] if answer >= 10 else ""  # a digit dropped, or nothing
    elif kind == 4:
        text = str(answer) + rng.choice("+=.-x")  # a stray character
    else:
        text = rng.choice(["", "=", "+", str(answer)[::-1] + "0"])
    return text if text.strip() != str(answer) else text + "1"


def example(rng: random.Random) -> Example:
    a, b = rng.randint(0, MAX_OPERAND), rng.randint(0, MAX_OPERAND)
    prompt = f"{a}+{b}="
    if rng.random() < 0.5:
        return prompt, rng.choice(["", " "]) + str(a + b), True
    return prompt, wrong_answer(rng, a + b), False


def judge_rows(tokenizer: Any, examples: list[Example]) -> sft.Batch:
    """input_ids, attention_mask and labels (-100 outside the verdict and its <eos>)."""
    rows: list[tuple[list[int], list[int]]] = []
    for prompt, completion, right in examples:
        answer = sum(int(x) for x in prompt[:-1].split("+"))
        ask = tokenizer(fill(DEFAULT_TEMPLATE, prompt, completion, {"answer": answer}))["input_ids"]
        verdict = [*tokenizer("1" if right else "0", add_special_tokens=False)["input_ids"]]
        verdict.append(tokenizer.eos_token_id)
        rows.append(([*ask, *verdict], [-100] * len(ask) + verdict))
    return pad_rows(rows, tokenizer.pad_token_id)


@torch.no_grad()
def verdict_accuracy(model: Any, tokenizer: Any, examples: list[Example]) -> float:
    """Share of `examples` whose greedy first verdict token is the right digit."""
    model.eval()
    ids, mask, labels = judge_rows(tokenizer, examples)
    logits = model(input_ids=ids, attention_mask=mask).logits  # (B, T, V)
    first = (labels != -100).int().argmax(dim=1)  # (B,) position of the verdict digit
    rows = torch.arange(len(examples))
    predicted = logits[rows, first - 1].argmax(dim=-1)  # logits at t-1 predict token t
    model.train()
    return float((predicted == ids[rows, first]).float().mean())


def evaluation_set(seed: int, n: int = 512) -> list[Example]:
    rng = random.Random(seed + 1_000_003)  # disjoint from the training stream's generator
    return [example(rng) for _ in range(n)]


def build(out: Path, seed: int = 0, target: float = 0.84, max_steps: int = 1000) -> dict[str, Any]:
    """Fine-tune tiny-arith into the judge and save it to `out`; returns the build info."""
    start = time.perf_counter()
    torch.set_num_threads(1)  # one thread: the same result on any machine of any size
    torch.manual_seed(seed)
    tokenizer = load_tokenizer("grpo-stream/tiny-arith")
    tokenizer.padding_side = "right"  # SFT rows are right-padded (pad_rows)
    model = load_policy("grpo-stream/tiny-arith", dtype="float32", trainable=True)
    held = evaluation_set(seed)
    plan = WarmStart(
        batches=lambda rng: judge_rows(tokenizer, [example(rng) for _ in range(64)]),
        score=lambda m: verdict_accuracy(m, tokenizer, held),
        target=target,
        max_steps=max_steps,
        eval_every=25,
        label="verdict_acc",
    )
    steps, acc = sft.warm_start(model, plan, seed)
    tokenizer.padding_side = "left"  # as the policy's: the judge generates left-padded

    def measure(saved: Any, reloaded: Any) -> dict[str, Any]:  # with the tokenizer it built
        return {
            "verdict_accuracy": round(verdict_accuracy(saved, tokenizer, held), 4),
            "accuracy_examples": len(held),
            "template": DEFAULT_TEMPLATE,
        }

    built = Built(seed, steps, target, base="grpo-stream/tiny-arith")
    fields = built.fields(verdict_accuracy_at_stop=round(acc, 4))
    return finish(model, tokenizer, out, fields, measure, start)


def main(argv: list[str] | None = None) -> None:
    info = build_main(__doc__, build, "grpo_stream/assets/tiny-judge", 0.84, 1000, argv)
    print(f"greedy verdict accuracy: {info['verdict_accuracy']:.3f}")


if __name__ == "__main__":
    main()
