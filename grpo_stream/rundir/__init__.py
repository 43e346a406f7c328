"""What a run directory says about its run, read without any service alive.

- `lock`: one run per run directory (an flock held by `up`, or by a hub started alone);
- `outcome`: how the run ended (RUN_DIR/outcome.json);
- `final`: the final state `status` and the dashboard show (steps, counters, checkpoints);
- `evals`: the evaluations during training (RUN_DIR/eval.jsonl).
"""
