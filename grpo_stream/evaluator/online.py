"""One evaluation pass during training, and the evaluation set it runs on.

Invariants: the evaluation problems are the first `eval.problems` of the evaluation task
(the training task's held-out part, or eval.task), the same at every version; they share no
prompt with the training stream (held-out parts by construction, an explicit eval.task checked
by `check_disjoint`); sampling uses the run's seed at every version, so two versions differ
only by their weights; results go to RUN_DIR/eval.jsonl (one JSON object per evaluation) and
the TensorBoard sink, with keys eval/pass@1, eval/pass@k, eval/reward.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from grpo_stream.agents.player import AgentPlayer
from grpo_stream.config.tasks import RewardSpec, TaskSettings
from grpo_stream.evaluation import GREEDY_TOP_P, Sample, Tally, score_group
from grpo_stream.evaluator.agents import evaluate_agent
from grpo_stream.rewards import RewardFn, load_reward, reward_specs
from grpo_stream.rundir.evals import EVAL_FILE
from grpo_stream.sampling import Sampling
from grpo_stream.tasks import Problem, Task, TaskDataError, make_eval_task, make_task
from grpo_stream.training.sinks import make_sinks

if TYPE_CHECKING:
    from grpo_stream.config import RunConfig
    from grpo_stream.engines import Engine
    from grpo_stream.training.sinks import Sink

log = structlog.get_logger()

MAX_OVERLAP_SCAN = 50_000
"""Training problems compared with an explicit eval.task's (endless tasks: the first ones)."""
_SEQUENCES_PER_CALL = 256


def eval_task_settings(cfg: RunConfig) -> TaskSettings:
    """The settings the evaluation task is built from (its rewards come from there too)."""
    return cfg.task if cfg.eval.task is None else cfg.eval.task


def make_eval_set(cfg: RunConfig, tokenizer: Any = None) -> Task:
    """The evaluation task: eval.task, or the training task's held-out part."""
    if cfg.eval.task is not None:
        return make_task(cfg.eval.task, tokenizer)
    return make_eval_task(cfg.task, tokenizer)


def check_disjoint(cfg: RunConfig, tokenizer: Any = None) -> None:
    """An explicit eval.task shares no prompt with the training stream (one-line error)."""
    if cfg.eval.every == 0 or cfg.eval.task is None:
        return  # a held-out part never meets training
    evals = make_task(cfg.eval.task, tokenizer)
    prompts = {evals.problem(i).prompt for i in range(cfg.eval.problems)}
    train = make_task(cfg.task, tokenizer)
    for i in range(min(train.size or MAX_OVERLAP_SCAN, MAX_OVERLAP_SCAN)):
        prompt = train.problem(i).prompt
        if prompt in prompts:
            raise TaskDataError(
                f"eval.task overlaps the training prompts ({prompt[:60]!r} is in both): use "
                "task.holdout instead of eval.task, or another split or dataset"
            )


SCORES = {"pass_at_1": "eval/pass@1", "pass_at_k": "eval/pass@k", "reward": "eval/reward"}
"""What `eval.done` logs of an evaluation row."""


@dataclass
class OnlineEval:
    """Evaluates engine weights on the fixed evaluation problems."""

    cfg: RunConfig
    task: Task
    specs: list[RewardSpec]
    fns: list[RewardFn]
    problems: list[Problem]
    sinks: list[Sink] = field(default_factory=list)

    @classmethod
    def build(cls, cfg: RunConfig, tokenizer: Any = None) -> OnlineEval:
        check_disjoint(cfg, tokenizer)
        task = make_eval_set(cfg, tokenizer)
        specs = reward_specs(eval_task_settings(cfg), task)
        problems = [task.problem(i) for i in range(cfg.eval.problems)]
        tensorboard: list[str] = [s for s in cfg.run.sinks if s == "tensorboard"]
        sinks = make_sinks(tensorboard, Path(cfg.run.run_dir), {})
        return cls(cfg, task, specs, [load_reward(s) for s in specs], problems, sinks)

    def run(self, engine: Engine, step: int, agents: AgentPlayer | None = None) -> dict[str, Any]:
        """Evaluate the engine's weights (an agent run: through `agents`, the run's agent
        against the evaluator's endpoint); write and return the row."""
        if agents is not None:
            return self._run_agents(engine, step, agents)
        ev, gen = self.cfg.eval, self.cfg.generator
        t0 = time.perf_counter()
        tally = Tally(specs=self.specs)
        per_call = max(1, _SEQUENCES_PER_CALL // ev.k)
        for start in range(0, len(self.problems), per_call):
            batch = self.problems[start : start + per_call]
            sampling = Sampling(
                max_tokens=ev.max_tokens or gen.max_tokens,
                temperature=ev.temperature or gen.temperature,
                top_p=GREEDY_TOP_P if ev.greedy else 1.0,
                seed=self.cfg.run.seed + start,
            )
            groups = engine.generate([p.prompt for p in batch], ev.k, sampling)
            for problem, group in zip(batch, groups, strict=True):
                samples = [Sample(c.text, c.truncated) for c in group.completions]
                score_group(self.fns, tally, problem, samples)
        summary = tally.summary(ev.k)
        row: dict[str, Any] = {
            "step": step,
            "policy_version": engine.version,
            "eval/pass@1": summary["pass_at_1"],
            "eval/pass@k": summary["pass_at_k"],
            "eval/k": ev.k,
            "eval/reward": summary["mean_reward"],
            **{f"eval/reward/{n}": v for n, v in summary["reward_means"].items()},
            "eval/reward_errors": summary["reward_errors"],
            "eval/truncated": summary["truncated"],
        }
        return self._record(row, t0)

    def _run_agents(self, engine: Engine, step: int, agents: AgentPlayer) -> dict[str, Any]:
        gen, t0 = self.cfg.generator, time.perf_counter()
        sampling = Sampling.of(gen, seed=self.cfg.run.seed)
        fields = evaluate_agent(agents, self.problems, self.cfg.eval, sampling)
        row: dict[str, Any] = {
            "step": step,
            "policy_version": engine.version,
            **fields,
            "eval/k": self.cfg.eval.k,
        }
        return self._record(row, t0)

    def _record(self, row: dict[str, Any], t0: float) -> dict[str, Any]:
        """`row` with its problem count, the seconds since `t0` and the wall time, written
        to RUN_DIR/eval.jsonl and logged."""
        row["eval/problems"] = len(self.problems)
        row["eval/seconds"] = round(time.perf_counter() - t0, 3)
        row["wall_time"] = time.time()
        self._write(row)
        scores = {name: round(row[key], 4) for name, key in SCORES.items()}
        log.info("eval.done", step=row["step"], seconds=row["eval/seconds"], **scores)
        return row

    def _write(self, row: dict[str, Any]) -> None:
        path = Path(self.cfg.run.run_dir) / EVAL_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
        for sink in self.sinks:
            sink.write(int(row["step"]), row)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
