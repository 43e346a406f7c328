"""bench.vs_trl's 10x model: the tiny model's tokenizer on a Qwen2 with about 10x its parameters.

Hidden size and heads x2, layers x2.5, randomly initialised (seeded, two torch threads: the
build is deterministic), then warm-started with the tiny model's own SFT recipe for at most
`sft_steps` steps; saved in bf16. `--keep-10x DIR` builds it once and reuses it while its
build.json asks for the same seed, SFT cap and base model.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

BUILD_THREADS = 2  # torch threads while building the 10x model (as build_tiny)


def build_10x(tiny: str, out: Path, seed: int, sft_steps: int) -> dict[str, Any]:
    """A ~10x wider/deeper Qwen2 with the tiny model's tokenizer, saved to `out` (bf16)."""
    import torch
    from transformers import AutoConfig, Qwen2Config, Qwen2ForCausalLM

    from grpo_stream.models.build_tiny import arith_pairs, expected_accuracy, warm_start
    from grpo_stream.models.loading import load_tokenizer, resolve_model

    start = time.perf_counter()
    base = AutoConfig.from_pretrained(resolve_model(tiny)).to_dict()
    head_dim = base["hidden_size"] // base["num_attention_heads"]
    wide = dict(base)
    wide.pop("layer_types", None)  # derived from num_hidden_layers again
    wide.update(
        hidden_size=2 * base["hidden_size"],
        intermediate_size=2 * base["intermediate_size"],
        num_hidden_layers=math.ceil(2.5 * base["num_hidden_layers"]),
        num_attention_heads=2 * base["num_attention_heads"],
        num_key_value_heads=2 * base["num_key_value_heads"],
        head_dim=head_dim,
    )
    tokenizer = load_tokenizer(tiny)
    threads = torch.get_num_threads()
    torch.set_num_threads(BUILD_THREADS)  # the build is deterministic for a thread count
    torch.manual_seed(seed)
    model: Any = Qwen2ForCausalLM(Qwen2Config(**wide))
    if sft_steps > 0:
        steps, acc = warm_start(model, tokenizer, seed, 0.30, sft_steps, eval_every=50)
    else:
        steps, acc = 0, expected_accuracy(model, tokenizer, arith_pairs())
    torch.set_num_threads(threads)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    return {"path": str(out), "parameters": params, "sft_steps": steps,
            "expected_accuracy": round(acc, 4),
            "build_s": round(time.perf_counter() - start, 1)}  # fmt: skip


def model_10x(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """The 10x model: built in `tmp`, or once into --keep-10x (its build.json says how)."""
    if args.keep_10x is None:
        return build_10x(args.model, tmp / "model-10x", args.seed, args.sft_steps)
    record = args.keep_10x / "build.json"
    wanted = {"seed": args.seed, "sft_cap": args.sft_steps, "base": args.model}
    if record.exists():
        info: dict[str, Any] = json.loads(record.read_text())
        if info.get("wanted") == wanted:
            return info
    info = build_10x(args.model, args.keep_10x, args.seed, args.sft_steps)
    record.write_text(json.dumps({**info, "wanted": wanted}))
    return info


def count_parameters(model: str) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    from grpo_stream.models.loading import resolve_model

    auto: Any = AutoModelForCausalLM
    config = AutoConfig.from_pretrained(resolve_model(model))
    return int(sum(p.numel() for p in auto.from_config(config).parameters()))


def with_context(model: str, out: Path, context: int) -> str:
    """A copy of `model` whose config allows `context` positions (its rotary embeddings take
    any position; past the trained context the model is untrained there, so rewards of a
    long workload stay near 0: the point is speed). Returns its path."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from grpo_stream.models.loading import load_tokenizer, resolve_model

    source = resolve_model(model)
    config = AutoConfig.from_pretrained(source)
    if config.max_position_embeddings >= context:
        return model
    auto: Any = AutoModelForCausalLM
    lm = auto.from_pretrained(source)
    lm.config.max_position_embeddings = context
    lm.save_pretrained(out, safe_serialization=True)
    load_tokenizer(model).save_pretrained(out)
    return str(out)
