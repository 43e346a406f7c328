"""bench.vs_trl's models, each built locally: the 10x Qwen2, a word-level Qwen2, a GPT-2.

- 10x: the tiny model's tokenizer on a Qwen2 with hidden size and heads x2, layers x2.5
  (about 10x its parameters).
- word: a Qwen2 of about 1M parameters over a 16-token word-level tokenizer (the four
  specials, the ten digits, `+` and `=`, each a word): about 7 tokens an addition prompt.
- gpt2: a GPT2LMHeadModel (absolute position embeddings, 64 of them) of about 1M parameters
  with the tiny model's character-level tokenizer.

Each is randomly initialised (seeded, two torch threads: the build is deterministic), then
warm-started with the tiny model's own SFT recipe on arith (stop at expected accuracy 0.30)
for at most `sft_steps` steps, and saved in bf16 with its tokenizer. `--keep-10x DIR` (and
the matrix's `--keep DIR`) builds a model once and reuses it while its build.json asks for
the same build.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BUILD_THREADS = 2  # torch threads while building a model (as build_tiny)
SFT_TARGET = 0.30  # the tiny model's: expected sampled accuracy on arith where SFT stops
WORDS = [*"0123456789", "+", "="]
"""The word-level tokenizer's words after its four specials (<pad> <bos> <eos> <unk>)."""
SMALL_POSITIONS = 64  # the word and GPT-2 models' context (the tiny model's)


def warm_and_save(
    make_model: Callable[[], Any], tokenizer: Any, out: Path, seed: int, sft_steps: int
) -> dict[str, Any]:
    """The model `make_model` builds (seeded, BUILD_THREADS torch threads), warm-started on
    arith for at most `sft_steps` steps, saved to `out` in bf16 with `tokenizer`: its build
    info (expected accuracy measured after the warm start)."""
    import torch

    from grpo_stream.builds.tiny import arith_pairs, expected_accuracy, warm_start

    start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(BUILD_THREADS)  # the build is deterministic for a thread count
    torch.manual_seed(seed)
    model = make_model()
    steps = 0
    if sft_steps > 0:
        steps, _ = warm_start(model, tokenizer, seed, SFT_TARGET, sft_steps, eval_every=50)
    acc = expected_accuracy(model, tokenizer, arith_pairs())
    torch.set_num_threads(threads)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    return {"path": str(out), "parameters": params, "sft_steps": steps,
            "expected_accuracy": round(acc, 4),
            "build_s": round(time.perf_counter() - start, 1)}  # fmt: skip


def build_10x(tiny: str, out: Path, seed: int, sft_steps: int) -> dict[str, Any]:
    """A ~10x wider/deeper Qwen2 with the tiny model's tokenizer, saved to `out` (bf16)."""
    from transformers import AutoConfig, Qwen2Config, Qwen2ForCausalLM

    from grpo_stream.models.loading import load_tokenizer, resolve_model

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

    def make() -> Any:
        return Qwen2ForCausalLM(Qwen2Config(**wide))

    return warm_and_save(make, load_tokenizer(tiny), out, seed, sft_steps)


def word_tokenizer() -> Any:
    """The 16-token word-level tokenizer: whitespace splits words, each digit is a word of
    its own, `<bos>` prepended, tokens joined without spaces on decoding.

    Saved beside a Qwen2, transformers 5 loads it back as Qwen2Tokenizer, which keeps this
    vocabulary but imposes Qwen's own pre-tokenizer (digits one by one, punctuation runs)
    and byte-level decoder: on arithmetic text (digits, `+`, `=`) the two agree token for
    token (tests/unit/bench/test_vs_trl_matrix.py checks the round trip).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from grpo_stream.builds.tiny import SPECIAL_TOKENS

    fast: Any = PreTrainedTokenizerFast
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *WORDS])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(r"\d"), "isolated")]
    )
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return fast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>",
                eos_token="<eos>", unk_token="<unk>", padding_side="left",
                model_max_length=SMALL_POSITIONS)  # fmt: skip


def build_word(out: Path, seed: int, sft_steps: int) -> dict[str, Any]:
    """A Qwen2 of about 1M parameters (hidden 128, 3 layers, head_dim 64) over
    `word_tokenizer`, warm-started and saved to `out`."""
    from transformers import Qwen2ForCausalLM

    from grpo_stream.models.testing import qwen2_config

    tokenizer = word_tokenizer()
    config = qwen2_config(
        len(tokenizer), hidden=128, intermediate=704, layers=3, heads=2, kv_heads=2,
        positions=SMALL_POSITIONS, tie=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    return warm_and_save(lambda: Qwen2ForCausalLM(config), tokenizer, out, seed, sft_steps)


def build_gpt2(tiny: str, out: Path, seed: int, sft_steps: int) -> dict[str, Any]:
    """A GPT2LMHeadModel of about 1M parameters (hidden 128, 4 layers, 2 heads, 64
    positions) with the tiny model's tokenizer, warm-started and saved to `out`."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from grpo_stream.models.loading import load_tokenizer

    tokenizer = load_tokenizer(tiny)
    config = GPT2Config(
        vocab_size=len(tokenizer), n_embd=128, n_layer=4, n_head=2,
        n_positions=SMALL_POSITIONS, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    return warm_and_save(lambda: GPT2LMHeadModel(config), tokenizer, out, seed, sft_steps)


def cached_build(
    out: Path, wanted: dict[str, Any], build: Callable[[Path], dict[str, Any]]
) -> dict[str, Any]:
    """The model `build` makes in `out`, built there once: reused while out/build.json
    records the same `wanted` (seed, SFT cap, base), rebuilt otherwise."""
    kept = cached_info(out, wanted)
    if kept is not None:
        return kept
    info = build(out)
    (out / "build.json").write_text(json.dumps({**info, "wanted": wanted}))
    return info


def cached_info(out: Path, wanted: dict[str, Any]) -> dict[str, Any] | None:
    """The build info in out/build.json if it records `wanted`; None otherwise."""
    record = out / "build.json"
    if not record.exists():
        return None
    info: dict[str, Any] = json.loads(record.read_text())
    return info if info.get("wanted") == wanted else None


def model_10x(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """The 10x model: built in `tmp`, or once into --keep-10x (its build.json says how)."""
    if args.keep_10x is None:
        return build_10x(args.model, tmp / "model-10x", args.seed, args.sft_steps)
    wanted = {"seed": args.seed, "sft_cap": args.sft_steps, "base": args.model}

    def build(out: Path) -> dict[str, Any]:
        return build_10x(args.model, out, args.seed, args.sft_steps)

    return cached_build(args.keep_10x, wanted, build)


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
