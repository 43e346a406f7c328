"""Evaluation during training: settings, the evaluation set, one evaluation pass.

The `evaluator` service (services/evaluator.py) runs `OnlineEval` on every `eval.every`-th
weights version the trainer publishes; `grpo-stream eval` (grpo_stream.evaluation) shares the
scoring and pass@k code.
"""

from __future__ import annotations

from grpo_stream.config.evaluator import EvalSettings, check_eval_config

__all__ = ["EvalSettings", "check_eval_config"]
