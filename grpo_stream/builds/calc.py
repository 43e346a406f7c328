"""Build the tiny model of the `calc` environment: `python -m grpo_stream.builds.calc`.

Like tiny-arith (`grpo_stream.builds.tiny`: the same character-level tokenizer and
Qwen2 shape, 128 positions) with a short supervised warm start on whole `calc` episodes
(`grpo_stream.envs.calc`) of the task's problems `a op b =` (a, b <= 99, op in + - *). Half
of the demonstrations call the tool: the policy writes `<calc>a op b</calc><eos>` (trained),
the environment answers `[value]` (not trained), the policy copies the value then `<eos>`
(trained); the other half answer `value<eos>` at once. Answering at once is hard for a
model this small (two-digit products), calling the tool is copying: GRPO starts from a
policy that calls the tool some of the time and has a clear way to improve, calling it
more and copying better.

SFT stops as soon as the expected success at temperature 1.0 on a fixed set of problems
reaches `--target`: the probability of sampling one of the two demonstrated episodes, from
one teacher-forced forward pass (a lower bound of the success rate: other replies, e.g.
`<calc>48*37</calc>`, can succeed too; noise-free, and far cheaper than playing episodes
on a busy machine).

Invariants: deterministic for a given seed and torch version (one thread, BUILD_THREADS);
weights saved in bfloat16; the success and tool-call rates in build_info.json are measured
on the weights as saved and reloaded, through the hf engine.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import torch

from grpo_stream.builds import sft
from grpo_stream.builds.sft import Batch, Built, WarmStart, build_main, finish, pad_rows
from grpo_stream.builds.tiny import build_model, build_tokenizer
from grpo_stream.config.envs import EnvSettings
from grpo_stream.envs.calc import CalcEnv
from grpo_stream.sampling import Sampling
from grpo_stream.tasks.arith import ArithTask

MAX_POSITIONS = 128
TURNS = 3
MAX_EPISODE_TOKENS = 64
TURN_TOKENS = 20
TOOL_SHARE = 0.5
"""Share of the demonstrations that call the tool."""
EVAL_PROBLEMS = 64
BUILD_THREADS = 1
"""Torch threads of the build (the weights depend on it): one, because on a shared 2-core
machine two threads ran an SFT step 6x slower than one (29 s vs 5 s, measured)."""


def calc_task(seed: int) -> ArithTask:
    """The problems of `task.name = "calc"` at its defaults (a, b <= 99, + - *)."""
    return ArithTask(seed=seed, max_operand=99, ops="+-*", name="calc")


def demo_episode(
    tokenizer: Any, prompt: str, answer: int, use_tool: bool
) -> tuple[list[int], list[int]]:
    """Token ids and labels (-100 off the policy's tokens) of one demonstrated episode."""
    env = CalcEnv(turns=TURNS)
    env.reset(prompt, {"answer": answer})
    ids: list[int] = tokenizer(prompt)["input_ids"]
    labels = [-100] * len(ids)
    if use_tool:
        call = f"<calc>{prompt.removesuffix('=')}</calc>"
        move = [*tokenizer(call, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
        obs = tokenizer(env.step(call).observation, add_special_tokens=False)["input_ids"]
        ids += [*move, *obs]
        labels += [*move, *([-100] * len(obs))]
    move = [*tokenizer(str(answer), add_special_tokens=False)["input_ids"]]
    move.append(tokenizer.eos_token_id)
    return ids + move, labels + move


def sft_batch(tokenizer: Any, task: ArithTask, rng: random.Random, size: int = 32) -> Batch:
    """`size` demonstrations of random training problems (indices past the eval set's)."""
    rows = []
    for _ in range(size):
        p = task.problem(rng.randrange(EVAL_PROBLEMS, 10**9))
        rows.append(
            demo_episode(tokenizer, p.prompt, int(p.reference["answer"]), rng.random() < TOOL_SHARE)
        )
    return pad_rows(rows, tokenizer.pad_token_id)


@torch.no_grad()
def expected_success(model: Any, tokenizer: Any, seed: int) -> float:
    """Mean over the first EVAL_PROBLEMS problems of P(tool episode) + P(direct answer)
    under the policy at temperature 1.0 (disjoint: their first tokens differ)."""
    task = calc_task(seed)
    problems = [task.problem(i) for i in range(EVAL_PROBLEMS)]
    was_training = model.training
    model.eval()
    total = torch.zeros(EVAL_PROBLEMS)
    for use_tool in (True, False):
        rows = [
            demo_episode(tokenizer, p.prompt, int(p.reference["answer"]), use_tool)
            for p in problems
        ]
        ids, mask, labels = pad_rows(rows, tokenizer.pad_token_id)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()  # (B, T-1, V)
        target = labels[:, 1:]  # (B, T-1)
        logp = torch.log_softmax(logits, -1).gather(-1, target.clamp(min=0).unsqueeze(-1))[..., 0]
        total += ((logp * (target != -100)).sum(-1)).exp()  # (B,)
    model.train(was_training)
    return float(total.mean())


def success_rate(model: Any, tokenizer: Any, seed: int, samples: int = 4) -> tuple[float, float]:
    """(success rate, share of episodes that called the tool) of sampled episodes at
    temperature 1.0 on the first EVAL_PROBLEMS problems, each `samples` times."""
    settings = EnvSettings(name="calc", max_turns=TURNS, max_episode_tokens=MAX_EPISODE_TOKENS)
    task = calc_task(seed)
    problems = [(p.prompt, p.reference) for p in map(task.problem, range(EVAL_PROBLEMS))]
    episodes = sft.sampled_episodes(
        model,
        tokenizer,
        lambda: CalcEnv(turns=TURNS),
        settings,
        problems,
        samples,
        Sampling(TURN_TOKENS, temperature=1.0, seed=seed),
    )
    calls = sum(any("<calc>" in t for t in e.texts) for e in episodes)
    return sum(e.reward for e in episodes) / len(episodes), calls / len(episodes)


def warm_start(
    model: Any, tokenizer: Any, seed: int, target: float, max_steps: int, eval_every: int
) -> tuple[int, float]:
    """SFT on calc episodes until the expected success reaches `target`."""
    task = calc_task(seed)
    plan = WarmStart(
        batches=lambda rng: sft_batch(tokenizer, task, rng),
        score=lambda m: expected_success(m, tokenizer, seed),
        target=target,
        max_steps=max_steps,
        eval_every=eval_every,
        label="success",
    )
    return sft.warm_start(model, plan, seed)


def build(out: Path, seed: int = 0, target: float = 0.30, max_steps: int = 2000) -> dict[str, Any]:
    """Build, warm-start and save tiny-calc to `out`; returns the build info and time."""
    start = time.perf_counter()
    torch.set_num_threads(BUILD_THREADS)
    tokenizer = build_tokenizer()
    tokenizer.model_max_length = MAX_POSITIONS
    model = build_model(tokenizer, seed, positions=MAX_POSITIONS)
    steps, expected = warm_start(model, tokenizer, seed, target, max_steps, eval_every=5)

    def measure(saved: Any, reloaded: Any) -> dict[str, Any]:
        rate, calls = success_rate(saved, reloaded, seed, samples=8)
        return {
            "success_rate": round(rate, 4),
            "tool_call_rate": round(calls, 4),
            "episodes": EVAL_PROBLEMS * 8,
        }

    fields = Built(seed, steps, target).fields(
        tool_share=TOOL_SHARE, expected_success_at_stop=round(expected, 4)
    )
    return finish(model, tokenizer, out, fields, measure, start)


def main(argv: list[str] | None = None) -> None:
    build_main(__doc__, build, "grpo_stream/assets/tiny-calc", 0.30, 2000, argv)


if __name__ == "__main__":
    main()
