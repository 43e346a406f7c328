"""Off-policy corrections under staleness: reward gain after N steps, same seed, same work.

Staleness is simulated in one process, with the real parts: the trainer is the real
`TrainState` (its `train_step`, grpo_loss, regularizer and rollback guard), the generator the
real `HFEngine` (its sampling code) holding a copy of the policy that lags `k` versions
behind: at trainer version v it samples with the weights of version max(0, v - k), kept in a
queue of snapshots. So every batch of a run at max_staleness k is exactly k versions stale
(the worst case a hub with max_staleness = k lets through). Rewards are the task's own
reward functions; advantages the algo package's `group_advantages`; zero-signal groups are
dropped as the hub drops them; batches are the hub's `build_batch`.

reuse r: each step samples groups_per_step / r fresh prompts and trains on them plus the
groups of the previous r - 1 steps (each group is trained on r times, the older uses one
more version stale), so every step trains on the same number of groups; reuse 2 does half
the sampling.

Every run of one comparison has the same settings but the correction: lr, minibatches
(optimizer updates per batch, `trainer.minibatches`), is_cap, clip eps, steps, batch.

Measure: the mean reward of the final policy on held-out problems (task indices from
1_000_000, fixed sampling seed, the same for every run) minus that of the initial policy,
averaged over the seeds (each seed: its own init-free training randomness: sampling and
dropout-free updates, the same held-out set); the gain ratio of a cell is its mean gain over
the on-policy mean gain (staleness 0, reuse 1, tis; there tis, decoupled and behaviour
compute the same update up to rounding, none has no clip).

    python -m bench.off_policy                  # staleness 0 and 4, reuse 1, seed 0
    python -m bench.off_policy --full           # staleness 0,2,4,8 x 5 corrections x reuse 1,2
    python -m bench.off_policy --staleness 8 --reuse 2 --seeds 0,1 --name part3
    python -m bench.off_policy --merge part1 part2 part3 --name off_policy   # table + plot

Last line: `staleness4 best/onpolicy gain ratio: R` (best correction at staleness 4, reuse 1).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import add_smoke, parse, results_path, save_json
from bench.off_policy_table import MODES, merged, summarise
from grpo_stream.sampling import Sampling

EVAL_OFFSET = 1_000_000
SERIES = (
    "logp_gap",
    "is_weight_max",
    "clip_frac",
    "is_trunc_frac",
    "behaviour_clip_frac",
    "seq_mask_frac",
)
"""The step metrics each run keeps, one value per applied step."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60, help="applied trainer steps per run")
    p.add_argument("--staleness", default="0,4", help="comma-separated max_staleness values")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated off_policy modes")
    p.add_argument("--reuse", default="1", help="comma-separated reuse values")
    p.add_argument(
        "--s0-modes",
        default=None,
        help="modes run at staleness 0 (default: --modes); with one update per batch they "
        "compute the same update up to rounding, so tis alone is the on-policy reference",
    )
    p.add_argument("--full", action="store_true", help="staleness 0,2,4,8 x modes x reuse 1,2")
    p.add_argument("--seeds", default="0", help="comma-separated training seeds")
    p.add_argument("--minibatches", type=int, default=1, help="trainer.minibatches")
    p.add_argument("--is-cap", type=float, default=2.0, help="algo.loss.is_cap")
    p.add_argument("--is-floor", type=float, default=None, help="algo.loss.is_floor")
    p.add_argument("--seq-mask-low", type=float, default=None, help="algo.loss.seq_mask_low")
    p.add_argument("--seq-mask-high", type=float, default=None, help="algo.loss.seq_mask_high")
    p.add_argument("--eps-low", type=float, default=0.2, help="algo.loss.eps_low")
    p.add_argument("--eps-high", type=float, default=0.28, help="algo.loss.eps_high")
    p.add_argument(
        "--merge", nargs="+", default=None, help="summarise these results' runs (NAME or path)"
    )
    p.add_argument("--prompts-per-step", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-4, help="trainer.lr (its default)")
    p.add_argument(
        "--eval-prompts", type=int, default=512, help="held-out problems (512 x 4: s.e. ~0.008)"
    )
    p.add_argument("--eval-group", type=int, default=4, help="samples per held-out prompt")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--name", default="off_policy", help="bench/results/NAME.{json,png}")
    add_smoke(p)
    return p


SMOKE = ["--steps", "2", "--staleness", "0,1", "--modes", "tis", "--prompts-per-step", "2",
         "--group-size", "2", "--max-tokens", "4", "--eval-prompts", "4",
         "--eval-group", "1"]  # fmt: skip


SUFFIXES = {
    "bclip": ["algo.loss.behaviour_clip=true"],
    "geo": ['algo.loss.seq_mask="geometric"'],
    "mean": ['algo.loss.seq_mask="arithmetic"'],
}
"""A compared correction's suffix and the settings it adds: the behaviour clip, or the
sequence mask on the geometric or arithmetic mean of the token ratios."""


def mode_settings(mode: str) -> list[str]:
    """The config lines of a compared correction: an `algo.loss.off_policy` value, or
    VALUE+SUFFIX (that value with `SUFFIXES[SUFFIX]`: +bclip, +geo, +mean)."""
    base, plus, extra = mode.partition("+")
    if plus and extra not in SUFFIXES:
        raise ValueError(f"unknown correction {mode!r} (VALUE or VALUE+{'|'.join(SUFFIXES)})")
    lines = [f"algo.loss.off_policy={json.dumps(base)}"]
    return lines + (SUFFIXES[extra] if plus else [])


def band_settings(args: argparse.Namespace, mode: str) -> list[str]:
    """The mask bands given on the command line (the settings' defaults otherwise); the
    token floor only for icepop, the one mode it applies to."""
    given = {
        "is_floor": args.is_floor if mode.partition("+")[0] == "icepop" else None,
        "seq_mask_low": args.seq_mask_low,
        "seq_mask_high": args.seq_mask_high,
    }
    return [f"algo.loss.{key}={value}" for key, value in given.items() if value is not None]


class Sim:
    """The shared parts of every run: config maker, task, rewards, initial weights."""

    def __init__(self, args: argparse.Namespace) -> None:
        from grpo_stream.rewards import load_reward, reward_specs
        from grpo_stream.tasks import make_task

        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="grpo-offpolicy-"))
        base = self.config("tis", 0)
        self.task = make_task(base.task)
        self.specs = reward_specs(base.task, self.task)
        self.fns = [load_reward(s) for s in self.specs]

    def config(self, mode: str, run: int, seed: int = 0) -> Any:
        from grpo_stream.config import load_config

        a = self.args
        return load_config(
            None,
            [
                f"run.run_dir={json.dumps(str(self.tmp / f'run{run}'))}",
                f"run.seed={seed}",
                'model.dtype="float32"',
                f"trainer.lr={a.lr}",
                *mode_settings(mode),
                f"hub.groups_per_step={a.prompts_per_step}",
                f"generator.group_size={a.group_size}",
                f"generator.max_tokens={a.max_tokens}",
                f"trainer.minibatches={a.minibatches}",
                f"algo.loss.is_cap={a.is_cap}",
                f"algo.loss.eps_low={a.eps_low}",
                f"algo.loss.eps_high={a.eps_high}",
                *band_settings(a, mode),
            ],
        )

    def reward(self, text: str, index: int) -> float:
        from grpo_stream.rewards import combine

        problem = self.task.problem(index)
        values = []
        for fn in self.fns:
            try:
                value = float(fn(text, prompt=problem.prompt, reference=problem.reference))
            except Exception:  # a failing reward scores 0, as in evaluation.py
                value = 0.0
            values.append(value if math.isfinite(value) else 0.0)
        return combine(values, self.specs)

    def evaluate(self, engine: Any) -> float:
        """Mean reward on the held-out problems (fixed prompts and sampling seed)."""
        a = self.args
        indices = [EVAL_OFFSET + i for i in range(a.eval_prompts)]
        prompts = [self.task.problem(i).prompt for i in indices]
        groups = engine.generate(prompts, a.eval_group, Sampling(a.max_tokens, seed=7))
        scores = [
            self.reward(c.text, i)
            for i, g in zip(indices, groups, strict=True)
            for c in g.completions
        ]
        return float(np.mean(scores))


def _groups(
    sim: Sim, engine: Any, cursor: int, count: int, step: int, cfg: Any, seed: int
) -> tuple[list[Any], float]:
    """Sample, score and assemble `count` fresh groups (zero-signal ones dropped); and the
    mean reward of all the samples."""
    import torch

    from grpo_stream.algo.advantages import drops_group, group_advantages
    from grpo_stream.hub.replay import Group
    from grpo_stream.protocols.messages import SamplingParams

    a = sim.args
    indices = list(range(cursor, cursor + count))
    prompts = [sim.task.problem(i).prompt for i in indices]
    sampling = Sampling(a.max_tokens, seed=seed * 7919 + step)
    samples = engine.generate(prompts, a.group_size, sampling)
    out, total = [], 0.0
    for gid, sample in zip(indices, samples, strict=True):
        rewards = torch.tensor([sim.reward(c.text, gid) for c in sample.completions])
        total += float(rewards.mean())
        adv = group_advantages(rewards, cfg.algo.advantage)
        if drops_group(adv, cfg.algo.advantage):
            continue
        lengths = [len(c.token_ids) for c in sample.completions]
        out.append(
            Group(
                group_id=gid,
                policy_version=engine.version,
                prompt_ids=np.array(sample.prompt_ids, dtype=np.int32),
                completion_ids=np.array(
                    [t for c in sample.completions for t in c.token_ids], dtype=np.int32
                ),
                completion_offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                logprobs=np.array(
                    [x for c in sample.completions for x in c.logprobs], dtype=np.float32
                ),
                rewards=rewards.numpy().astype(np.float32),
                advantages=adv.advantages.numpy().astype(np.float32),
                valid=adv.valid_mask.numpy().astype(bool),
                sampling=SamplingParams(temperature=1.0, top_p=1.0, max_tokens=a.max_tokens),
            )
        )
    return out, total / len(indices)


def run_one(sim: Sim, staleness: int, mode: str, reuse: int, seed: int, run: int) -> dict[str, Any]:
    """One training run; returns its final held-out reward and per-step series."""
    import torch

    from grpo_stream.engines.hf import HFEngine
    from grpo_stream.hub.batches import build_batch
    from grpo_stream.models.loading import load_policy
    from grpo_stream.training.state import TrainState

    a = sim.args
    cfg = sim.config(mode, run, seed)
    torch.manual_seed(seed)
    state = TrainState.create(cfg)
    policy = load_policy(cfg.model.name_or_path, dtype="float32", device="cpu", trainable=False)
    engine = HFEngine(policy, state.tokenizer, "cpu")
    snapshots: deque[tuple[int, dict[str, torch.Tensor]]] = deque(maxlen=staleness + 1)
    recent: deque[list[Any]] = deque(maxlen=reuse - 1) if reuse > 1 else deque(maxlen=0)
    fresh_per_step = max(1, a.prompts_per_step // reuse)
    cursor, rewards = 0, []
    series: dict[str, list[float]] = {key: [] for key in SERIES}
    start = time.perf_counter()
    tries = 0
    while state.step < a.steps and tries < 3 * a.steps:
        tries += 1
        snapshots.append((state.version, {k: v.clone() for k, v in state.named_weights()}))
        version, weights_then = snapshots[0]  # the oldest kept: k versions behind at most
        if engine.version != version:
            engine.load_weights(weights_then.items(), version)
        fresh, sampled_reward = _groups(sim, engine, cursor, fresh_per_step, tries, cfg, seed)
        cursor += fresh_per_step
        groups = fresh + [g for old in recent for g in old]
        if reuse > 1:
            recent.append(fresh)
        if not groups:
            continue
        result = state.train_step(build_batch(state.step, groups))
        if result.applied:
            rewards.append(sampled_reward)  # of the (stale) policy that sampled this step
            for key, values in series.items():  # +bclip and the sequence masks only: 0 else
                values.append(result.metrics.get(key, 0.0))
    seconds = time.perf_counter() - start
    engine.load_weights(state.named_weights(), state.version)
    final = sim.evaluate(engine)
    return {
        "staleness": staleness,
        "mode": mode,
        "reuse": reuse,
        "seed": seed,
        "steps": state.step,
        "final_reward": final,
        "train_rewards": rewards,
        **series,
        "rollbacks": state.guard.total,
        "seconds": seconds,
    }


def grid(args: argparse.Namespace) -> list[tuple[int, str, int, int]]:
    """(staleness, mode, reuse, seed) of every run, the on-policy reference (0, tis, 1)
    first when it is in the grid."""
    if args.full:
        stale, modes, reuses = [0, 2, 4, 8], list(MODES), [1, 2]
    else:
        stale = [int(x) for x in args.staleness.split(",")]
        modes = [m for m in args.modes.split(",") if m]
        reuses = [int(x) for x in args.reuse.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    s0 = modes if args.s0_modes is None or args.full else [m for m in args.s0_modes.split(",") if m]
    runs = [
        (s, m, r, k)
        for k in seeds
        for r in reuses
        for s in stale
        for m in (s0 if s == 0 else modes)
    ]
    return sorted(runs, key=lambda x: (x[:3] != (0, "tis", 1), x[3]))


def main() -> None:
    import torch

    args = parse(build_parser(), None, SMOKE)
    torch.set_num_threads(args.threads)
    if args.merge:
        runs, initial, run_args = merged(args.merge)
        summarise(runs, initial, args.name, run_args)
        return
    sim = Sim(args)
    from grpo_stream.engines.hf import HFEngine
    from grpo_stream.models.loading import load_policy, load_tokenizer

    base = sim.config("tis", 0)
    policy = load_policy(base.model.name_or_path, dtype="float32", device="cpu", trainable=False)
    initial = sim.evaluate(HFEngine(policy, load_tokenizer(base.model.name_or_path), "cpu"))
    print(f"initial held-out reward {initial:.4f} ({args.eval_prompts}x{args.eval_group} samples)")
    runs = []
    for n, (s, m, r, seed) in enumerate(grid(args)):
        res = run_one(sim, s, m, r, seed, n)
        runs.append(res)
        print(
            f"staleness {s} reuse {r} seed {seed} {m:9s} reward {res['final_reward']:.4f} "
            f"gain {res['final_reward'] - initial:+.4f} steps {res['steps']} "
            f"gap {np.mean(res['logp_gap']):.3f} clip {np.mean(res['clip_frac']):.3f} "
            f"cut {np.mean(res['is_trunc_frac']):.3f} seqmask {np.mean(res['seq_mask_frac']):.3f} "
            f"rollbacks {res['rollbacks']} {res['seconds']:.0f}s",
            flush=True,
        )
        partial = {"args": vars(args), "initial_reward": initial, "runs": runs, "partial": True}
        save_json(results_path(f"{args.name}.json"), partial)  # a cut-off run keeps its cells
    summarise(runs, initial, args.name, vars(args))


if __name__ == "__main__":
    main()
