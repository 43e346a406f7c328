"""The shipped tiny model loads with plain transformers, and our loaders configure it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_stream.builds.tiny import arith_pairs, build_tokenizer, expected_accuracy
from grpo_stream.config import DEFAULT_MODEL
from grpo_stream.models.loading import load_policy, load_tokenizer, resolve_model


@pytest.fixture(scope="module")
def tiny_path() -> str:
    return resolve_model(DEFAULT_MODEL)


def test_default_model_resolves_to_the_packaged_assets(tiny_path: str) -> None:
    assert Path(tiny_path).is_dir()
    assert Path(tiny_path).name == "tiny-arith"
    assert (Path(tiny_path) / "model.safetensors").is_file()


def test_other_names_and_existing_paths_pass_through(tmp_path: Path) -> None:
    assert resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert resolve_model(str(tmp_path)) == str(tmp_path)


def test_a_missing_local_path_is_named_in_the_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="absent"):
        resolve_model(str(tmp_path / "absent"))


def test_auto_tokenizer_round_trips_text(tiny_path: str) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_path)
    text = "12+7=19 <think>a b\nc</think><answer>(3 - 1) * 4</answer>"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert len(ids) == len(text) + 1  # one token per ASCII character, plus <bos>
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_tokenizer_on_disk_matches_the_one_built(tiny_path: str) -> None:
    built = build_tokenizer()
    loaded = AutoTokenizer.from_pretrained(tiny_path)
    text = "Using the numbers [8, 3, 34], é?"
    assert loaded(text)["input_ids"] == built(text)["input_ids"]


def test_auto_model_is_a_small_qwen2_with_head_dim_64(tiny_path: str) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    cfg = model.config
    assert cfg.model_type == "qwen2"
    assert cfg.hidden_size // cfg.num_attention_heads >= 64
    assert 1_000_000 <= sum(p.numel() for p in model.parameters()) <= 5_000_000
    assert cfg.tie_word_embeddings


def test_build_info_records_an_accuracy_in_the_band(tiny_path: str) -> None:
    info = json.loads((Path(tiny_path) / "build_info.json").read_text())
    assert 0.25 <= info["sampled_accuracy"] <= 0.40
    assert info["seed"] == 0


def test_shipped_weights_answer_about_a_third_of_arith(tiny_path: str) -> None:
    torch.set_num_threads(1)
    model = load_policy(DEFAULT_MODEL, trainable=False)
    acc = expected_accuracy(model, load_tokenizer(DEFAULT_MODEL), arith_pairs())
    assert 0.25 <= acc <= 0.40


def test_load_tokenizer_pads_on_the_left() -> None:
    tok = load_tokenizer(DEFAULT_MODEL)
    batch = tok(["1+1=", "12+13="], padding=True)
    assert tok.padding_side == "left"
    assert batch["input_ids"][0][:2] == [tok.pad_token_id, tok.pad_token_id]
    assert batch["attention_mask"][0][:2] == [0, 0]


def test_load_tokenizer_sets_a_pad_token_when_missing(tmp_path: Path, tiny_path: str) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_path)
    tok.pad_token = None
    tok.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text((Path(tiny_path) / "config.json").read_text())
    loaded = load_tokenizer(str(tmp_path))
    assert loaded.pad_token == loaded.eos_token


def test_auto_dtype_on_cpu_is_float32_and_trainable() -> None:
    model = load_policy(DEFAULT_MODEL)
    assert next(model.parameters()).dtype == torch.float32
    assert model.training
    assert all(p.requires_grad for p in model.parameters())


def test_frozen_policy_has_no_gradients_and_the_asked_dtype() -> None:
    model = load_policy(DEFAULT_MODEL, dtype="bfloat16", trainable=False)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())


def test_sampled_completions_end_within_eight_tokens() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    tok = load_tokenizer(DEFAULT_MODEL)
    model = load_policy(DEFAULT_MODEL, trainable=False)
    batch = tok(["3+4=", "17+20="] * 16, return_tensors="pt", padding=True)
    out = model.generate(
        **batch, do_sample=True, top_k=0, max_new_tokens=8, pad_token_id=tok.pad_token_id
    )
    ended = [(row == tok.eos_token_id).any() for row in out[:, batch["input_ids"].shape[1] :]]
    assert sum(bool(e) for e in ended) >= 30
