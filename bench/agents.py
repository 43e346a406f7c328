"""What the OpenAI-compatible endpoint costs: the shipped tool example played by a user agent
over HTTP beside the same game played in process; and the reward rising when it trains.

    python -m bench.agents            # throughput, then a training run of --train-steps
    python -m bench.agents --smoke    # a few episodes, no training: seconds, not minutes

Throughput, all in this process on the shipped tiny-tools model (hf engine, CPU, the same
torch threads for both sides), `--prompts` calc problems x `--group` episodes of up to 3
replies (`grpo_stream.agents.calc`):

- in process: the turn loop (`envs.episodes.run_episodes`) against `CalcToolsEnv` in the
  generator's sandboxed env workers: the engine's `complete` through its turn session, the
  tool's answer rendered as the template's tool message (`TurnFormat(role="tool")`);
- endpoint: `calc_agent` (the openai client) in the agent sandbox, each reply a
  `/v1/chat/completions` request to the endpoint, the agents' requests sampled as batches
  through the same engine session (`grpo_stream.agents.player`).

Both sides play the same problems with the same rules and parser, at temperature 1.0, so
their episodes are alike but not identical (the batches differ). Rates: episodes per second
of wall, and seconds per policy turn; the ratio endpoint/in-process of the time per episode
is the overhead (goal <= 1.2x), and the difference of the time per turn is the overhead per
turn. Sides alternate within each repeat; medians over `--repeats`.

Training: `grpo-stream up --task calc-tools` for `--train-steps` steps (0: none); mean
reward of the first and last `--window` steps, tool calls and malformed calls at the end.
Results: bench/results/agents.json. No wall time is asserted anywhere.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, environment, run_pipeline, save_json
from grpo_stream.envs.episodes import EpisodeRun, run_episodes
from grpo_stream.sampling import Sampling

MODEL = "grpo-stream/tiny-tools"
AGENT = "grpo_stream.agents.calc:calc_agent"
ENV = "grpo_stream.agents.calc:CalcToolsEnv"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads (both sides)")
    p.add_argument("--workers", type=int, default=1, help="env / agent worker processes")
    p.add_argument("--train-steps", type=int, default=60)
    p.add_argument("--window", type=int, default=10, help="steps averaged at each end")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="2 prompts x 2, one repeat, no training")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "agents.json")
    return p


def settings(args: argparse.Namespace, **kw: Any) -> Any:
    from grpo_stream.builds.tools import MAX_EPISODE_TOKENS, TURNS
    from grpo_stream.config.envs import EnvSettings

    return EnvSettings(max_turns=TURNS, max_episode_tokens=MAX_EPISODE_TOKENS,
                       workers=args.workers, **kw)  # fmt: skip


def problems(args: argparse.Namespace, seed: int) -> list[Any]:
    from grpo_stream.builds.calc import calc_task

    task = calc_task(args.seed)
    return [task.problem(seed * args.prompts + i) for i in range(args.prompts)]


def in_process(engine: Any, pool: Any, args: argparse.Namespace, seed: int) -> dict[str, float]:
    """One batch through the turn loop against CalcToolsEnv."""
    from grpo_stream.agents.chat import ChatFormat
    from grpo_stream.builds.tools import TURN_TOKENS, env_prompt
    from grpo_stream.envs.turns import TurnFormat

    fmt = ChatFormat(engine.tokenizer)
    batch = problems(args, seed)
    run = EpisodeRun(
        prompts=[env_prompt(fmt, p.prompt) for p in batch], references=[p.reference for p in batch],
        group_size=args.group, sampling=Sampling(TURN_TOKENS, seed=seed),
    )  # fmt: skip
    turns = TurnFormat(engine.tokenizer, chat=True, role="tool")
    start = time.perf_counter()
    groups = run_episodes(engine, engine.tokenizer, pool, turns, pool.settings, run)
    return tally([e for g in groups for e in g], time.perf_counter() - start)


def endpoint(player: Any, args: argparse.Namespace, seed: int) -> dict[str, float]:
    """One batch played by calc_agent over HTTP."""
    from grpo_stream.builds.tools import TURN_TOKENS

    batch = problems(args, seed)
    run = EpisodeRun(
        prompts=[p.prompt for p in batch],
        references=[p.reference for p in batch],
        group_size=args.group,
        sampling=Sampling(TURN_TOKENS, seed=seed),
    )
    start = time.perf_counter()
    groups = player.play_run(run)
    return tally([e for g in groups for e in g], time.perf_counter() - start)


def tally(episodes: list[Any], seconds: float) -> dict[str, float]:
    turns = sum(len(e.turn_starts) for e in episodes)
    return {
        "seconds": seconds,
        "episodes": len(episodes),
        "turns": turns,
        "sampled": sum(sum(e.mask) for e in episodes),
        "success": sum(e.reward for e in episodes if e.error is None) / len(episodes),
        "failed": sum(e.error is not None for e in episodes),
        "episodes_per_s": len(episodes) / seconds,
        "s_per_turn": seconds / max(turns, 1),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from grpo_stream.agents.player import AgentPlayer
    from grpo_stream.engines.hf import HFEngine
    from grpo_stream.envs.sandbox import EnvPool
    from grpo_stream.models.loading import load_policy, load_tokenizer

    engine = HFEngine(load_policy(MODEL, dtype="float32", trainable=False), load_tokenizer(MODEL))
    sides: dict[str, list[dict[str, float]]] = {"in_process": [], "endpoint": []}
    with (
        EnvPool(settings(args, name=ENV)) as pool,
        AgentPlayer(settings(args, agent=AGENT), engine, engine.tokenizer, MODEL) as player,
    ):
        in_process(engine, pool, args, 10_000)  # warm-up: workers, allocator, first requests
        endpoint(player, args, 10_000)
        for r in range(args.repeats):
            sides["in_process"].append(in_process(engine, pool, args, r))
            sides["endpoint"].append(endpoint(player, args, r))
        agent_stats = player.stats()
    med = {side: {k: statistics.median(x[k] for x in runs) for k in runs[0]}
           for side, runs in sides.items()}  # fmt: skip
    a, b = med["in_process"], med["endpoint"]
    return {
        "median": med,
        "time_per_episode_ratio": a["episodes_per_s"] / b["episodes_per_s"],
        "time_per_turn_ratio": b["s_per_turn"] / a["s_per_turn"],
        "overhead_ms_per_turn": 1000 * (b["s_per_turn"] - a["s_per_turn"]),
        "endpoint_stats": agent_stats,
        "repeats": sides,
    }


def train(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """`grpo-stream up --task calc-tools` for --train-steps steps."""
    from grpo_stream.envs.presets import task_preset

    overrides = [*task_preset("calc-tools"), f"run.seed={args.seed}",
                 f"run.torch_threads={args.threads}"]  # fmt: skip
    series = run_pipeline("calc-tools", tmp / "train", args.train_steps, overrides)
    k = min(args.window, len(series.steps) // 2)
    return {
        "steps": len(series.steps),
        "wall_s": series.total_s,
        f"reward_first{k}": series.reward_first(k),
        f"reward_last{k}": series.reward_last(k),
        "rewards": series.rewards,
    }


def main(argv: list[str] | None = None) -> None:
    import torch

    args = build_parser().parse_args(argv)
    if args.smoke:
        args.prompts, args.group, args.repeats, args.train_steps = 2, 2, 1, 0
    torch.set_num_threads(args.threads)
    load = {"before": os.getloadavg()}
    result = measure(args)
    if args.train_steps:
        with tempfile.TemporaryDirectory(prefix="bench-agents-") as tmp:
            result["training"] = train(args, Path(tmp))
    load["after"] = os.getloadavg()
    result.update(args={k: str(v) for k, v in vars(args).items()}, environment=environment(),
                  load_average=load)  # fmt: skip
    save_json(args.out, result)
    report(result)


def report(result: dict[str, Any]) -> None:
    a, b = result["median"]["in_process"], result["median"]["endpoint"]
    print(f"episodes/s: in process {a['episodes_per_s']:.2f}  endpoint {b['episodes_per_s']:.2f}"
          f"  -> time per episode endpoint/in-process {result['time_per_episode_ratio']:.2f}x"
          " (goal <= 1.2)")  # fmt: skip
    print(f"s per turn: in process {a['s_per_turn'] * 1000:.1f} ms  endpoint "
          f"{b['s_per_turn'] * 1000:.1f} ms  -> {result['time_per_turn_ratio']:.2f}x, "
          f"overhead {result['overhead_ms_per_turn']:.1f} ms per turn")  # fmt: skip
    per = [x["turns"] / x["episodes"] for x in (a, b)]
    print(f"success: in process {a['success']:.3f}  endpoint {b['success']:.3f}; turns per "
          f"episode {per[0]:.2f} vs {per[1]:.2f}")  # fmt: skip
    if "training" in result:
        t = result["training"]
        first, last = (v for k, v in t.items() if k.startswith("reward_"))
        print(f"training {t['steps']} steps: mean reward {first:.3f} -> {last:.3f}")


if __name__ == "__main__":
    main()
