"""math_verify reward calls per second: the plain library call per completion (before) against
the scorer's path (after: the fast path, the reference's parse kept, each distinct completion
of a group once, a group per worker call), side by side on two workloads of groups of G:

- short: numeric answers as a policy on "a+b=" writes them: the right number in about half
  the completions, a few wrong numbers, now and then something that is not a plain number
  ("1 2", "12+", "twelve"), so completions repeat within a group;
- gsm8k: a paragraph of reasoning ending in "The answer is N.", "#### N", "\\boxed{N}", "= N"
  or (for the parser) "$N$" and "N dollars", right about half the time; texts rarely repeat.

Columns: `before` the plain library call (parse of the reference, of the completion, verify)
per completion in this process; `fast` our math_verify_reward per completion in this process
(no cache, no worker); `after` the RewardPool of the scorer (`--workers` processes) scoring
the groups as the scorer does (IPC included). Each as completions scored per wall second and
CPU microseconds per completion (this process's, plus the pool's workers' for `after`): the
CPU column holds its ratio on a loaded machine, where wall rates swing. Every verdict of
`fast` and `after` must equal `before`'s (the bench fails otherwise).

Run: python -m bench.rewards [--groups 200] [--workers 1]; --smoke: a few groups, nothing
saved. Last line: `reward calls/s before -> after: short B -> A (Rx; CPU Cx less), gsm8k ...`.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import structlog

from bench.common import add_smoke, environment, parse, results_path, save_json
from grpo_stream.config.tasks import RewardSpec
from grpo_stream.rewards.builtin import math_verify_reward
from grpo_stream.rewards.sandbox import RewardPool

Group = tuple[list[str], str]
"""A group's completions and its reference answer."""
REASONING = (
    "{name} has {a} apples and buys {b} more, so {name} has {a} + {b} = {s} apples. "
    "Then {name} gives away {c}, which leaves {s} - {c} = {n}."
)


def short_groups(count: int, group_size: int, rng: random.Random) -> list[Group]:
    """Groups of short numeric answers to "a+b=" (see the module doc)."""
    groups = []
    for _ in range(count):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        answer = a + b
        wrong = [answer + d for d in rng.sample([-10, -2, -1, 1, 2, 10], 3)]
        odd = [f"{a} {b}", f"{answer}+", "twelve", f"{answer}.5"]
        texts = []
        for _ in range(group_size):
            draw = rng.random()
            pick = answer if draw < 0.5 else rng.choice(wrong) if draw < 0.9 else rng.choice(odd)
            texts.append(str(pick))
        groups.append((texts, str(answer)))
    return groups


def gsm8k_groups(count: int, group_size: int, rng: random.Random) -> list[Group]:
    """Groups of GSM8K-style reasoning ending in an answer (see the module doc)."""
    endings = ["The answer is {n}.", "#### {n}", "\\boxed{{{n}}}", "So the total = {n}"]
    parser_endings = ["The answer is ${n}$.", "She keeps {n} dollars."]
    groups = []
    for _ in range(count):
        a, b, c = rng.randint(10, 500), rng.randint(10, 500), rng.randint(1, 9)
        answer = a + b - c
        texts = []
        for _ in range(group_size):
            shown = answer if rng.random() < 0.5 else answer + rng.choice([-c, c, 1, 10])
            name = rng.choice(["Natalia", "James", "Mia", "Omar"])
            body = REASONING.format(name=name, a=a, b=b, s=a + b, c=c, n=shown)
            ending = rng.choice(endings if rng.random() < 0.8 else parser_endings)
            texts.append(f"{body} {ending.format(n=shown)}")
        groups.append((texts, str(answer)))
    return groups


def before(completion: str, gold_text: str) -> float:
    """The plain math-verify library call, as the reward made it per completion before the
    fast path (also the reference tests/unit/rewards/test_mathfast.py compares it with)."""
    from math_verify import parse as mv_parse
    from math_verify import verify

    gold = mv_parse(gold_text, parsing_timeout=0)
    if not gold and "$" not in gold_text:
        gold = mv_parse(f"${gold_text}$", parsing_timeout=0)
    pred = mv_parse(completion, parsing_timeout=0)
    return float(bool(pred) and verify(gold, pred, timeout_seconds=None))


@dataclass(frozen=True)
class Cost:
    """What scoring a workload cost: completions per wall second, CPU microseconds per
    completion (this process and, through the pool, its workers: steadier under load)."""

    per_s: float
    cpu_us: float


def in_process(groups: list[Group], score: Callable[[str, str], float]) -> tuple[Cost, list]:
    """The cost of `score` called per completion (after one call that does its imports), and
    its verdicts."""
    score("The answer is $\\frac{1}{2}$", "0.5")
    start, cpu = time.perf_counter(), time.process_time()
    verdicts = [[score(text, gold) for text in texts] for texts, gold in groups]
    return _cost(groups, time.perf_counter() - start, time.process_time() - cpu), verdicts


def fast(completion: str, gold_text: str) -> float:
    return math_verify_reward(completion, prompt="", reference={"answer": gold_text})


def pooled(groups: list[Group], workers: int) -> tuple[Cost, list]:
    """The cost through the scorer's RewardPool (started and warmed before the clock)."""
    spec = RewardSpec(name="math_verify")
    quiet = structlog.wrap_logger(structlog.ReturnLogger())
    with RewardPool([spec], workers, 30.0, 2048, quiet) as pool:
        for _ in range(workers):  # every worker parses once: its first call's imports done
            pool.submit("", ["The answer is $\\frac{1}{2}$"], {"answer": "0.5"})
        while pool.busy():
            pool.collect(math.inf)
        start, cpu, worker_cpu = time.perf_counter(), time.process_time(), pool.cpu_s()
        tickets = [pool.submit("", texts, {"answer": gold}) for texts, gold in groups]
        done: dict[int, Any] = {}
        while pool.busy():
            done.update(pool.collect(math.inf))
        seconds = time.perf_counter() - start
        cpu_s = time.process_time() - cpu + pool.cpu_s() - worker_cpu
    return _cost(groups, seconds, cpu_s), [done[t].rewards.tolist() for t in tickets]


def _cost(groups: list[Group], seconds: float, cpu_s: float) -> Cost:
    completions = sum(len(texts) for texts, _ in groups)
    return Cost(per_s=completions / seconds, cpu_us=1e6 * cpu_s / completions)


def measure(name: str, groups: list[Group], workers: int) -> dict[str, Any]:
    quick, fast_verdicts = in_process(groups, fast)  # first: `before` then meets warm caches
    was, verdicts = in_process(groups, before)  # (sympy's, math_verify's): conservative
    now, pool_verdicts = pooled(groups, workers)  # its workers start cold
    if fast_verdicts != verdicts or pool_verdicts != verdicts:
        raise SystemExit(f"{name}: verdicts differ from the plain math_verify call")
    distinct = sum(len(set(texts)) for texts, _ in groups) / sum(len(t) for t, _ in groups)
    row = {
        "before": asdict(was),
        "fast": asdict(quick),
        "after": asdict(now),
        "ratio": now.per_s / was.per_s,
        "cpu_ratio": was.cpu_us / now.cpu_us,
        "distinct_share": distinct,
    }
    print(
        f"{name:7} before {was.per_s:7.0f}/s {was.cpu_us:7.0f} us  fast {quick.per_s:7.0f}/s "
        f"{quick.cpu_us:7.0f} us  after {now.per_s:7.0f}/s {now.cpu_us:7.0f} us CPU/completion "
        f"({row['ratio']:.1f}x calls/s, {row['cpu_ratio']:.1f}x less CPU; {distinct:.0%} distinct)",
        flush=True,
    )
    return row


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="math_verify reward calls/s, before and after")
    parser.add_argument("--groups", type=int, default=200, help="groups of each workload")
    parser.add_argument("--group-size", type=int, default=8, help="G")
    parser.add_argument("--workers", type=int, default=1, help="reward workers of `after`")
    parser.add_argument("--seed", type=int, default=0)
    add_smoke(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(build_parser(), argv, smoke=["--groups", "4"])
    rng = random.Random(args.seed)
    workloads = {
        "short": short_groups(args.groups, args.group_size, rng),
        "gsm8k": gsm8k_groups(args.groups, args.group_size, rng),
    }
    print(f"load average {' '.join(f'{x:.2f}' for x in environment()['load_average'])}")
    rows = {name: measure(name, groups, args.workers) for name, groups in workloads.items()}
    if not args.smoke:
        data = {"args": vars(args), "workloads": rows, "environment": environment()}
        print(f"saved {save_json(results_path('rewards.json'), data)}")
    cells = [
        f"{n} {r['before']['per_s']:.0f} -> {r['after']['per_s']:.0f} ({r['ratio']:.1f}x; "
        f"CPU {r['cpu_ratio']:.1f}x less)"
        for n, r in rows.items()
    ]
    print(f"reward calls/s before -> after: {', '.join(cells)}")


if __name__ == "__main__":
    main()
