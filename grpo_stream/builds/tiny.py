"""Build the tiny model that ships with grpo-stream: `python -m grpo_stream.builds.tiny`.

The result is a Hugging Face model directory (safetensors + tokenizer + build_info.json) that
`AutoModelForCausalLM` / `AutoTokenizer` (transformers 4.x and 5.x) and vLLM load like any
other model:

- a character-level tokenizer: one token per byte, so one per ASCII character (a byte-level
  BPE with no merges; see `build_tokenizer` for why not WordLevel), `<bos>` prepended;
- a Qwen2ForCausalLM of about 1.3M parameters with head_dim 64 (what vLLM's kernels need);
- a short supervised warm start on arith (`a+b=` -> `c<eos>`, a, b <= 20) that stops as soon
  as the expected accuracy of sampling at temperature 1.0 reaches `--target`, so GRPO starts
  from a policy that is right about a third of the time and has room to improve.

Invariants: the build is deterministic for a given seed, torch version and thread count
(seeded generators, fixed problem order, a noise-free stopping rule); the saved weights are
bfloat16 (small on disk) and the accuracies in build_info.json are measured on the weights
as saved and reloaded.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import torch

from grpo_stream.builds import sft
from grpo_stream.builds.sft import Built, WarmStart, build_main, finish, pad_rows
from grpo_stream.models.testing import qwen2_config

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
MAX_OPERAND = 20
MAX_POSITIONS = 64


def byte_symbols() -> list[str]:
    """The printable stand-in for each byte 0..255 used by byte-level BPE tokenizers (GPT-2's).

    Printable Latin-1 bytes stand for themselves; the others (space, newline, controls) take
    the code points from 256 upwards, in byte order: space is "Ġ", newline is "Ċ".
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    symbols: list[str] = []
    shifted = 0
    for byte in range(256):
        if byte in keep:
            symbols.append(chr(byte))
        else:
            symbols.append(chr(256 + shifted))
            shifted += 1
    return symbols


def build_tokenizer() -> Any:
    """The character-level tokenizer (one token per byte), wrapped as a PreTrainedTokenizerFast.

    It is a byte-level BPE with no merges rather than a WordLevel model: transformers 5 loads
    every `qwen2` checkpoint's tokenizer as Qwen2Tokenizer, which keeps the vocabulary and
    merges of tokenizer.json but imposes its own byte-level pre-tokenizer and decoder. With no
    merges that class and this tokenizer.json agree on every text, and ASCII is one token per
    character.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    fast: Any = PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *byte_symbols()])}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.TemplateProcessing(
        single="<bos> $A",
        pair="<bos> $A $B",
        special_tokens=[("<bos>", vocab["<bos>"])],
    )
    return fast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
        model_max_length=MAX_POSITIONS,
        model_input_names=["input_ids", "attention_mask"],
    )


def build_model(tokenizer: Any, seed: int, positions: int = MAX_POSITIONS) -> Any:
    """A freshly initialised Qwen2ForCausalLM sized for the tokenizer (and `positions`)."""
    from transformers import Qwen2ForCausalLM

    config = qwen2_config(
        len(tokenizer),
        hidden=128,
        intermediate=640,
        layers=4,
        heads=2,  # head_dim 64: vLLM's attention kernels need >= 64
        kv_heads=2,
        positions=positions,
        tie=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def arith_pairs() -> list[tuple[int, int]]:
    return [(a, b) for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)]


def sft_batch(
    tokenizer: Any, pairs: list[tuple[int, int]]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids, attention_mask and labels (-100 outside the completion), right-padded."""
    rows: list[tuple[list[int], list[int]]] = []
    for a, b in pairs:
        prompt = tokenizer(f"{a}+{b}=")["input_ids"]
        completion = [*tokenizer(str(a + b), add_special_tokens=False)["input_ids"]]
        completion.append(tokenizer.eos_token_id)
        rows.append(([*prompt, *completion], [-100] * len(prompt) + completion))
    return pad_rows(rows, tokenizer.pad_token_id)


@torch.no_grad()
def expected_accuracy(model: Any, tokenizer: Any, pairs: list[tuple[int, int]]) -> float:
    """Mean probability of sampling the exact answer then <eos> at temperature 1.0.

    One teacher-forced forward pass gives, for each problem, the product of the conditional
    probabilities of the reference completion: the accuracy that sampling converges to,
    without sampling noise.
    """
    model.eval()
    ids, mask, labels = sft_batch(tokenizer, pairs)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()  # (B, T-1, V)
    target = labels[:, 1:]  # (B, T-1)
    logp = torch.log_softmax(logits, -1).gather(-1, target.clamp(min=0).unsqueeze(-1))[..., 0]
    seq_logp = (logp * (target != -100)).sum(-1)  # (B,)
    model.train()
    return float(seq_logp.exp().mean())


@torch.no_grad()
def sampled_accuracy(
    model: Any, tokenizer: Any, pairs: list[tuple[int, int]], seed: int, max_tokens: int = 8
) -> float:
    """Share of `pairs` answered exactly (stripped, then <eos>) by sampling at temperature 1.0."""
    model.eval()
    torch.manual_seed(seed)
    batch = tokenizer([f"{a}+{b}=" for a, b in pairs], return_tensors="pt", padding=True)
    out = model.generate(
        **batch,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model.train()
    right = 0
    for (a, b), row in zip(pairs, out[:, batch["input_ids"].shape[1] :].tolist(), strict=True):
        if tokenizer.eos_token_id in row:
            text = tokenizer.decode(row[: row.index(tokenizer.eos_token_id)])
            right += text.strip() == str(a + b)
    return right / len(pairs)


def warm_start(
    model: Any, tokenizer: Any, seed: int, target: float, max_steps: int, eval_every: int
) -> tuple[int, float]:
    """SFT on arith until the expected sampled accuracy reaches `target`: (steps, accuracy)."""
    pairs = arith_pairs()
    plan = WarmStart(
        batches=lambda rng: sft_batch(tokenizer, [rng.choice(pairs) for _ in range(64)]),
        score=lambda m: expected_accuracy(m, tokenizer, pairs),
        target=target,
        max_steps=max_steps,
        eval_every=eval_every,
        label="expected_acc",
    )
    return sft.warm_start(model, plan, seed)


def build(out: Path, seed: int = 0, target: float = 0.30, max_steps: int = 3000) -> dict[str, Any]:
    """Build, warm-start and save the tiny model to `out`; returns the build info and time.

    build_info.json leaves the time out, so that a rebuild writes the same file.
    """
    start = time.perf_counter()
    torch.set_num_threads(2)
    random.seed(seed)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed)
    steps, sft_acc = warm_start(model, tokenizer, seed, target, max_steps, eval_every=5)
    pairs = arith_pairs() * 4  # every problem, four samples each

    def measure(saved: Any, reloaded: Any) -> dict[str, Any]:
        accuracy = sampled_accuracy(saved, reloaded, pairs, seed=seed)
        return {
            "expected_accuracy": round(expected_accuracy(saved, reloaded, arith_pairs()), 4),
            "sampled_accuracy": round(accuracy, 4),
            "accuracy_samples": len(pairs),
        }

    fields = Built(seed, steps, target).fields(expected_accuracy_at_stop=round(sft_acc, 4))
    return finish(model, tokenizer, out, fields, measure, start)


def main(argv: list[str] | None = None) -> None:
    info = build_main(__doc__, build, "grpo_stream/assets/tiny-arith", 0.30, 3000, argv)
    print(f"sampled accuracy at temperature 1.0: {info['sampled_accuracy']:.3f}")


if __name__ == "__main__":
    main()
