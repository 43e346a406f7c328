"""What the turn loop costs: multi-turn `guess` episodes beside single-turn sampling, per
token, on the generator and on the trainer; and episodes/s with 1 vs 2 env workers.

    python -m bench.multi_turn

All in this process, on the shipped tiny-guess model (hf engine, CPU, the same torch
threads for every side):

- generator: `--prompts` x `--group` guess episodes (`envs.episodes.run_episodes`, up to
  `--turns` turns of 3 sampled tokens, the environment in the generator's sandboxed env
  worker pool: real worker processes, real pipes) against single-turn sampling of the same
  rows (`HFEngine.complete`, one 3-token reply to the bare prompt), repeated until it has
  sampled at least as many tokens. Rate: sampled tokens / wall. The per-token cost ratio
  episodes/single (headline: against `single_generate` below, the single-turn task's own
  path) is what the turn loop adds (each turn prefills the tokens appended since
  the last: the observation and the last sampled token, the KV cache of the rest kept by
  `engines.turn_cache`; environment round trips; bookkeeping); goal <= 1.3. Beside it, the
  same episodes with the turn cache hidden (`WholeRows`: every turn prefills each row
  whole, the path before KV reuse and that of engines without a turn session), and whether
  both sampled the same tokens (same seed). And single-turn through a fresh turn cache per
  call (`single_prompt_shared`): the prompt prefilled once for all rows. Every row here has
  the same bare prompt, so that side is nearly pure decode: a lower bound on single-turn
  cost, not what distinct prompts cost. And the single-turn task's own generator path
  (`single_generate`: `HFEngine.generate` of `--prompts` prompts x `--group`, each prompt
  prefilled once and its cache repeated for its group's rows, 3-token completions).
- trainer: one `TrainState.train_step` on the episode groups (loss mask, per-turn
  advantages) against the same token ids as single-turn groups (every completion token in
  the loss, one advantage per sequence): equal tokens, so the ratio is the cost of the
  episode-specific tensors.
- env workers: episodes/s of the same episode batch with env.workers = 1 and 2. The
  environment code runs in the generator's env worker pool (not the scorer: episode runs
  start none), so this is the knob that adds environment parallelism.

Sides alternate within each repeat; medians over `--repeats`. Results: bench/results/
multi_turn.json. No wall time is asserted anywhere.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, add_smoke, environment, parse, save_json
from grpo_stream.sampling import Sampling

MODEL = "grpo-stream/tiny-guess"
PROMPT = "guess 1-16:"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads (every side)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "multi_turn.json")
    add_smoke(p)
    return p


SMOKE = ["--prompts", "2", "--group", "2", "--turns", "2", "--repeats", "1",
         "--out", "{tmp}/multi_turn.json"]  # fmt: skip


def episodes_once(engine: Any, pool: Any, args: argparse.Namespace, seed: int) -> Any:
    from grpo_stream.config.envs import EnvSettings
    from grpo_stream.envs.episodes import EpisodeRun, run_episodes
    from grpo_stream.envs.turns import TurnFormat
    from grpo_stream.tasks.guess import GuessTask

    task = GuessTask(seed=seed)
    problems = [task.problem(i) for i in range(args.prompts)]
    run = EpisodeRun(
        prompts=[p.prompt for p in problems],
        references=[p.reference for p in problems],
        group_size=args.group,
        sampling=Sampling(3, seed=seed),
        key_base=seed * args.prompts * args.group,
    )
    settings = EnvSettings(name="guess", max_turns=args.turns, max_episode_tokens=64)
    fmt = TurnFormat(engine.tokenizer, chat=False)
    t0 = time.perf_counter()
    groups = run_episodes(engine, engine.tokenizer, pool, fmt, settings, run)
    return groups, time.perf_counter() - t0


class WholeRows:
    """The engine with its turn cache hidden: every turn prefills each row whole (the
    episodes' path before KV reuse, and what engines without a turn session do)."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.tokenizer = engine, engine.tokenizer

    def complete(self, *args: Any, **kwargs: Any) -> Any:
        return self.engine.complete(*args, **kwargs)


def single_once(
    engine: Any, rows: int, tokens: int, seed: int, shared: bool = False
) -> tuple[int, float]:
    """Single-turn 3-token replies to the bare prompt until `tokens` are sampled. `shared`:
    through a fresh turn cache per call, so the prompt is prefilled once for all rows (what
    the episodes' first turn does), not once per row (`complete`)."""
    ids = engine.tokenizer([PROMPT])["input_ids"][0]
    sampled, t0, k = 0, time.perf_counter(), 0
    while sampled < tokens:
        sample = engine.open_turns().complete if shared else None
        if sample is not None:
            out = sample(list(range(rows)), [list(ids)] * rows, Sampling(3, seed=seed * 1000 + k))
        else:
            out = engine.complete([list(ids)] * rows, Sampling(3, seed=seed * 1000 + k))
        sampled += sum(len(c.token_ids) for c in out)
        k += 1
    return sampled, time.perf_counter() - t0


def generate_once(
    engine: Any, args: argparse.Namespace, tokens: int, seed: int
) -> tuple[int, float]:
    """The single-turn task's own generator path until `tokens` are sampled:
    `HFEngine.generate` of `--prompts` prompts x `--group` 3-token completions (each prompt
    prefilled once, its cache repeated for the group's rows)."""
    sampled, t0, k = 0, time.perf_counter(), 0
    while sampled < tokens:
        out = engine.generate(
            [PROMPT] * args.prompts, args.group, Sampling(3, seed=seed * 1000 + k)
        )
        sampled += sum(len(c.token_ids) for g in out for c in g.completions)
        k += 1
    return sampled, time.perf_counter() - t0


def train_groups(groups: list[list[Any]]) -> tuple[list[Any], list[Any]]:
    """The episode groups as the hub builds them, and the same tokens as single-turn groups."""
    import dataclasses

    import numpy as np

    from grpo_stream.config.algo import AdvantageSettings
    from grpo_stream.envs.service import episode_rollout
    from grpo_stream.hub.batches import assemble
    from grpo_stream.hub.episodes import scored_by_env
    from grpo_stream.protocols import messages as m

    episodic, single = [], []
    for gid, eps in enumerate(groups):
        head = m.Rollout(
            lease_id=1, group_id=gid, instance="bench", policy_version=0,
            prompt_ids=np.zeros(0, np.int32), completion_ids=np.zeros(0, np.int32),
            completion_offsets=np.zeros(1, np.int64), logprobs=np.zeros(0, np.float32),
            texts=[], truncated=[], gen_seconds=0.0,
            sampling=m.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=3),
        )  # fmt: skip
        rollout = episode_rollout(head, eps)
        got = assemble(rollout, scored_by_env(rollout), AdvantageSettings(), None, "per_turn")
        if got.group is None:
            continue
        episodic.append(got.group)
        empty_mask, empty_adv = np.zeros(0, np.uint8), np.zeros(0, np.float32)
        single.append(
            dataclasses.replace(got.group, loss_mask=empty_mask, token_advantages=empty_adv)
        )
    return episodic, single


def train_step_s(state: Any, groups: list[Any], step: int) -> tuple[int, float]:
    from grpo_stream.hub.batches import build_batch

    batch = build_batch(step, groups)
    t0 = time.perf_counter()
    if not state.train_step(batch).applied:
        raise SystemExit(f"train step {step} was not applied")
    return len(batch.input_ids), time.perf_counter() - t0


def make_state(run_dir: Path) -> Any:
    from grpo_stream.config import load_config
    from grpo_stream.training.state import TrainState

    overrides = [
        f'run.run_dir="{run_dir}"',
        f'model.name_or_path="{MODEL}"',
        'trainer.device="cpu"',
        'task.name="guess"',
        'env.name="guess"',
    ]
    return TrainState.create(load_config(None, overrides))


def measure(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from grpo_stream.config.envs import EnvSettings
    from grpo_stream.engines.hf import HFEngine
    from grpo_stream.envs.sandbox import EnvPool
    from grpo_stream.models.loading import load_policy, load_tokenizer

    engine = HFEngine(load_policy(MODEL, dtype="float32", trainable=False), load_tokenizer(MODEL))
    rows = args.prompts * args.group
    sides: dict[str, list[float]] = {
        k: [] for k in ("episodes", "no_reuse", "single", "shared", "generate", "w1", "w2")
    }
    trainer: dict[str, list[float]] = {"episodes": [], "single": []}
    detail: list[dict[str, Any]] = []
    states = {"episodes": make_state(tmp / "e"), "single": make_state(tmp / "s")}
    with (
        EnvPool(EnvSettings(name="guess", workers=1)) as one,
        EnvPool(EnvSettings(name="guess", workers=2)) as two,
    ):
        episodes_once(engine, one, args, args.seed + 99)  # warm-up (workers, allocator)
        for r in range(args.repeats):
            seed = args.seed + r
            groups, wall = episodes_once(engine, one, args, seed)
            sampled = sum(sum(e.mask) for g in groups for e in g)
            single_tokens, single_wall = single_once(engine, rows, sampled, seed)
            shared_tokens, shared_wall = single_once(engine, rows, sampled, seed, shared=True)
            sides["shared"].append(shared_tokens / shared_wall)
            gen_tokens, gen_wall = generate_once(engine, args, sampled, seed)
            sides["generate"].append(gen_tokens / gen_wall)
            _, wall2 = episodes_once(engine, two, args, seed)
            whole, whole_wall = episodes_once(WholeRows(engine), one, args, seed)
            whole_sampled = sum(sum(e.mask) for g in whole for e in g)
            sides["episodes"].append(sampled / wall)
            sides["no_reuse"].append(whole_sampled / whole_wall)
            sides["single"].append(single_tokens / single_wall)
            sides["w1"].append(rows / wall)
            sides["w2"].append(rows / wall2)
            episodic, single = train_groups(groups)
            for name, part in (("episodes", episodic), ("single", single)):
                tokens, seconds = train_step_s(states[name], part, r)
                trainer[name].append(tokens / seconds)
            turns = [len(e.turn_starts) for g in groups for e in g]
            detail.append(
                {"sampled": sampled, "single_sampled": single_tokens, "episode_s": wall,
                 "single_s": single_wall, "episode_2w_s": wall2, "no_reuse_s": whole_wall,
                 "single_shared_s": shared_wall, "single_generate_s": gen_wall,
                 "no_reuse_sampled": whole_sampled,
                 "same_tokens": _same_tokens(groups, whole), "mean_turns": statistics.mean(turns),
                 "trained_groups": len(episodic)}
            )  # fmt: skip
    med = {k: statistics.median(v) for k, v in sides.items()}
    tmed = {k: statistics.median(v) for k, v in trainer.items()}
    return {
        "generator_tokens_per_s": {
            "episodes": med["episodes"],
            "episodes_no_reuse": med["no_reuse"],
            "single": med["single"],
            "single_prompt_shared": med["shared"],
            "single_generate": med["generate"],
        },
        "generator_cost_per_token_ratio_vs_generate": med["generate"] / med["episodes"],
        "generator_cost_per_token_ratio": med["single"] / med["episodes"],
        "generator_cost_per_token_ratio_no_reuse": med["single"] / med["no_reuse"],
        "generator_cost_per_token_ratio_vs_shared": med["shared"] / med["episodes"],
        "trainer_tokens_per_s": tmed,
        "trainer_cost_per_token_ratio": tmed["single"] / tmed["episodes"],
        "episodes_per_s": {"env_workers_1": med["w1"], "env_workers_2": med["w2"]},
        "env_workers_2_over_1": med["w2"] / med["w1"],
        "repeats": detail,
    }


def _same_tokens(a: list[list[Any]], b: list[list[Any]]) -> bool:
    """Both runs sampled the same trajectories (same seed, with and without the KV cache)."""
    return [e.token_ids for g in a for e in g] == [e.token_ids for g in b for e in g]


def main(argv: list[str] | None = None) -> None:
    import torch

    args = parse(build_parser(), argv, SMOKE)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-multi-turn-") as tmp:
        result = measure(args, Path(tmp))
    result["args"] = {k: str(v) for k, v in vars(args).items()}
    result["environment"] = environment()
    save_json(args.out, result)
    g, t = result["generator_tokens_per_s"], result["trainer_tokens_per_s"]
    w = result["episodes_per_s"]
    print(
        f"generator tokens/s: episodes {g['episodes']:.1f}  (no KV reuse "
        f"{g['episodes_no_reuse']:.1f})  single {g['single']:.1f}  (prompt prefilled once "
        f"{g['single_prompt_shared']:.1f}; through generate {g['single_generate']:.1f})"
    )
    print(f"trainer tokens/s:   episodes {t['episodes']:.1f}  single {t['single']:.1f}")
    same = all(r["same_tokens"] for r in result["repeats"])
    print(f"KV reuse sampled the tokens the no-reuse path sampled (same seed): {same}")
    print(f"episodes/s: 1 env worker {w['env_workers_1']:.2f}  2 {w['env_workers_2']:.2f}")
    print(
        f"cost per token episodes/single: generator vs the single-turn task's generate "
        f"{result['generator_cost_per_token_ratio_vs_generate']:.2f}x (vs complete, one "
        f"prefill per row {result['generator_cost_per_token_ratio']:.2f}x; no KV reuse "
        f"{result['generator_cost_per_token_ratio_no_reuse']:.2f}x; vs one shared prefill "
        f"{result['generator_cost_per_token_ratio_vs_shared']:.2f}x)  trainer "
        f"{result['trainer_cost_per_token_ratio']:.2f}x (goal <= 1.3)  "
        f"env workers 2/1: {result['env_workers_2_over_1']:.2f}x"
    )


if __name__ == "__main__":
    main()
