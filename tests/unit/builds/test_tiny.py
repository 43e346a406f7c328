"""The build script: its tokenizer is character-level, and a rebuild lands in the band."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from grpo_stream.builds.tiny import build, build_tokenizer, byte_symbols, sft_batch
from grpo_stream.models.loading import resolve_model


def test_byte_symbols_are_256_distinct_printable_stand_ins() -> None:
    symbols = byte_symbols()
    assert len(set(symbols)) == 256
    assert symbols[ord(" ")] == "Ġ"
    assert symbols[ord("\n")] == "Ċ"
    assert symbols[ord("7")] == "7"


def test_tokenizer_gives_one_token_per_ascii_character() -> None:
    tok = build_tokenizer()
    text = "(3 + 5) * 7 = 56\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids)[:3] == ["(", "3", "Ġ"]
    assert len(ids) == len(text)


def test_sft_batch_trains_only_on_the_answer_and_eos() -> None:
    tok = build_tokenizer()
    _, mask, labels = sft_batch(tok, [(12, 7), (1, 1)])
    first = labels[0][labels[0] != -100].tolist()
    assert tok.decode(first[:-1]) == "19"
    assert first[-1] == tok.eos_token_id
    assert int(mask[1].sum()) == 1 + len("1+1=2") + 1  # <bos> ... <eos>, then padding


@pytest.mark.slow
@pytest.mark.timeout(1200)  # minutes on a busy 2-core machine, ~30 s on an idle one
def test_rebuild_lands_in_the_band_with_the_shipped_size(tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    try:
        info = build(tmp_path / "tiny", seed=0)
    finally:
        torch.set_num_threads(threads)
    shipped = json.loads(
        (Path(resolve_model("grpo-stream/tiny-arith")) / "build_info.json").read_text()
    )
    assert 0.25 <= info["sampled_accuracy"] <= 0.40
    assert info["parameters"] == shipped["parameters"]
    assert (tmp_path / "tiny" / "model.safetensors").stat().st_size < 4_000_000


def test_the_judges_examples_are_labelled_as_exact_match_scores_them() -> None:
    import random

    from grpo_stream.builds.judge import example
    from grpo_stream.rewards.builtin import exact_match

    rng = random.Random(3)
    draws = [example(rng) for _ in range(2000)]
    for prompt, completion, right in draws:
        a, b = (int(x) for x in prompt[:-1].split("+"))
        assert right == bool(exact_match(completion, prompt=prompt, reference={"answer": a + b}))
    assert 0.4 < sum(r for *_, r in draws) / len(draws) < 0.6  # balanced
