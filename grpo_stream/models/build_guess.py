"""Build the tiny model of the `guess` environment: `python -m grpo_stream.models.build_guess`.

Like tiny-arith (`grpo_stream.models.build_tiny`: the same character-level tokenizer and
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

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from grpo_stream.envs.guess import GuessEnv
from grpo_stream.models.build_tiny import _compat_for_older_readers, build_tokenizer

MAX_POSITIONS = 128
HIGH = 16
TURNS = 4
MAX_EPISODE_TOKENS = 64
TURN_TOKENS = 3


def build_model(tokenizer: Any, seed: int) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=640,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


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
    rows = [demo_episode(tokenizer, t) for t in targets]
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)  # (B, T)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)  # (B, T)
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # (B, T)
    for i, (row, lab) in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        labels[i, : len(row)] = torch.tensor(lab)
        mask[i, : len(row)] = 1
    return ids, mask, labels


def success_rate(model: Any, tokenizer: Any, seed: int, samples: int = 4) -> tuple[float, float]:
    """(success rate, mean outcome reward) of sampled episodes at temperature 1.0, every
    target `samples` times, played by the hf engine's turn loop against in-process envs."""
    from grpo_stream.engines.hf import HFEngine
    from grpo_stream.envs.episodes import EpisodeRun, run_episodes
    from grpo_stream.envs.local import LocalEnvs
    from grpo_stream.envs.settings import EnvSettings
    from grpo_stream.envs.turns import TurnFormat

    was_training = model.training
    engine = HFEngine(model, tokenizer)
    settings = EnvSettings(name="guess", max_turns=TURNS, max_episode_tokens=MAX_EPISODE_TOKENS)
    targets = list(range(1, HIGH + 1))
    run = EpisodeRun(
        prompts=[f"guess 1-{HIGH}:"] * len(targets),
        references=[{"target": t, "high": HIGH} for t in targets],
        group_size=samples,
        max_tokens=TURN_TOKENS,
        temperature=1.0,
        top_p=1.0,
        seed=seed,
    )
    envs = LocalEnvs(lambda: GuessEnv(turns=TURNS))
    groups = run_episodes(engine, tokenizer, envs, TurnFormat(tokenizer, False), settings, run)
    episodes = [e for g in groups for e in g]
    model.train(was_training)
    wins = sum(any(r >= 1.0 for r in e.turn_rewards) for e in episodes)
    return wins / len(episodes), sum(e.reward for e in episodes) / len(episodes)


def warm_start(
    model: Any, tokenizer: Any, seed: int, target: float, max_steps: int, eval_every: int
) -> tuple[int, float]:
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    model.train()
    rate = 0.0
    for step in range(1, max_steps + 1):
        ids, mask, labels = sft_batch(tokenizer, [rng.randint(1, HIGH) for _ in range(32)])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % eval_every == 0:
            rate, _ = success_rate(model, tokenizer, seed)
            print(f"step {step:4d} loss {loss.item():.3f} success {rate:.3f}", flush=True)
            if rate >= target:
                return step, rate
    return max_steps, rate


def build(out: Path, seed: int = 0, target: float = 0.30, max_steps: int = 2000) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from grpo_stream.models.loading import load_policy

    start = time.perf_counter()
    torch.set_num_threads(2)
    tokenizer = build_tokenizer()
    tokenizer.model_max_length = MAX_POSITIONS
    model = build_model(tokenizer, seed)
    steps, rate_at_stop = warm_start(model, tokenizer, seed, target, max_steps, eval_every=5)
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _compat_for_older_readers(out)
    saved = load_policy(str(out), dtype="float32", trainable=False)
    rate, reward = success_rate(saved, AutoTokenizer.from_pretrained(out), seed + 1, samples=16)
    info = {
        "seed": seed,
        "sft_steps": steps,
        "target": target,
        "success_at_stop": round(rate_at_stop, 4),
        "success_rate": round(rate, 4),
        "mean_reward": round(reward, 4),
        "episodes": HIGH * 16,
        "parameters": sum(p.numel() for p in saved.parameters()),
        "torch": torch.__version__,
    }
    (out / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return {**info, "build_seconds": round(time.perf_counter() - start, 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("grpo_stream/assets/tiny-guess"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=0.30, help="Stop SFT at this success.")
    parser.add_argument("--max-steps", type=int, default=2000)
    args = parser.parse_args(argv)
    info = build(args.out, seed=args.seed, target=args.target, max_steps=args.max_steps)
    print(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
