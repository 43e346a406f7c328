"""Build the tiny model of the `guess` environment: `python -m grpo_stream.builds.guess`.

Like tiny-arith (`grpo_stream.builds.tiny`: the same character-level tokenizer and
Qwen2 shape, 128 positions instead of 64) with a short supervised warm start on whole
episodes of binary search: the prompt `guess 1-16:`, then per turn the midpoint of the range
the feedback allows and `<eos>` (trained), then the environment's `higher 9-16:` /
`lower 1-7:` (not trained). SFT stops as soon as the success rate of sampled episodes at
temperature 1.0 (played through `grpo_stream.envs.episodes`, every target 4 times, a fixed
seed) reaches `--target`, so GRPO starts from a policy that finds the number within 4
guesses about a third of the time.

Invariants: deterministic for a given seed, torch version and thread count; weights saved
in bfloat16; the success rate in build_info.json is measured on the weights as saved and
reloaded, through the hf engine.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from grpo_stream.builds import sft
from grpo_stream.builds.sft import Built, WarmStart, build_main, finish, pad_rows
from grpo_stream.builds.tiny import build_model, build_tokenizer
from grpo_stream.config.envs import EnvSettings
from grpo_stream.envs.guess import GuessEnv
from grpo_stream.sampling import Sampling

MAX_POSITIONS = 128
HIGH = 16
TURNS = 4
MAX_EPISODE_TOKENS = 64
TURN_TOKENS = 3


def demo_episode(tokenizer: Any, target: int) -> tuple[list[int], list[int]]:
    """Token ids and labels (-100 off the policy's tokens) of binary search for `target`."""
    env = GuessEnv(turns=TURNS)
    env.reset("", {"target": target, "high": HIGH})
    ids: list[int] = tokenizer(f"guess 1-{HIGH}:")["input_ids"]
    labels = [-100] * len(ids)
    low, high = 1, HIGH
    for _ in range(TURNS):
        guess = (low + high) // 2
        move = [
            *tokenizer(str(guess), add_special_tokens=False)["input_ids"],
            tokenizer.eos_token_id,
        ]
        ids += move
        labels += move
        step = env.step(str(guess))
        if step.done:
            break
        obs = tokenizer(step.observation, add_special_tokens=False)["input_ids"]
        ids += obs
        labels += [-100] * len(obs)
        low, high = env.low, env.high
    return ids, labels


def sft_batch(
    tokenizer: Any, targets: list[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return pad_rows([demo_episode(tokenizer, t) for t in targets], tokenizer.pad_token_id)


def success_rate(model: Any, tokenizer: Any, seed: int, samples: int = 4) -> tuple[float, float]:
    """(success rate, mean outcome reward) of sampled episodes at temperature 1.0, every
    target `samples` times, played by the hf engine's turn loop against in-process envs."""
    settings = EnvSettings(name="guess", max_turns=TURNS, max_episode_tokens=MAX_EPISODE_TOKENS)
    problems = [(f"guess 1-{HIGH}:", {"target": t, "high": HIGH}) for t in range(1, HIGH + 1)]
    episodes = sft.sampled_episodes(
        model,
        tokenizer,
        lambda: GuessEnv(turns=TURNS),
        settings,
        problems,
        samples,
        Sampling(TURN_TOKENS, temperature=1.0, seed=seed),
    )
    wins = sum(any(r >= 1.0 for r in e.turn_rewards) for e in episodes)
    return wins / len(episodes), sum(e.reward for e in episodes) / len(episodes)


def warm_start(
    model: Any, tokenizer: Any, seed: int, target: float, max_steps: int, eval_every: int
) -> tuple[int, float]:
    """SFT on binary-search episodes until the sampled success rate reaches `target`."""
    plan = WarmStart(
        batches=lambda rng: sft_batch(tokenizer, [rng.randint(1, HIGH) for _ in range(32)]),
        score=lambda m: success_rate(m, tokenizer, seed)[0],
        target=target,
        max_steps=max_steps,
        eval_every=eval_every,
        label="success",
    )
    return sft.warm_start(model, plan, seed)


def build(out: Path, seed: int = 0, target: float = 0.30, max_steps: int = 2000) -> dict[str, Any]:
    start = time.perf_counter()
    torch.set_num_threads(2)
    tokenizer = build_tokenizer()
    tokenizer.model_max_length = MAX_POSITIONS
    model = build_model(tokenizer, seed, positions=MAX_POSITIONS)
    steps, rate_at_stop = warm_start(model, tokenizer, seed, target, max_steps, eval_every=5)

    def measure(saved: Any, reloaded: Any) -> dict[str, Any]:
        rate, reward = success_rate(saved, reloaded, seed + 1, samples=16)
        return {
            "success_rate": round(rate, 4),
            "mean_reward": round(reward, 4),
            "episodes": HIGH * 16,
        }

    fields = Built(seed, steps, target).fields(success_at_stop=round(rate_at_stop, 4))
    return finish(model, tokenizer, out, fields, measure, start)


def main(argv: list[str] | None = None) -> None:
    build_main(__doc__, build, "grpo_stream/assets/tiny-guess", 0.30, 2000, argv)


if __name__ == "__main__":
    main()
