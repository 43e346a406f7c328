"""`grpo-stream export`: a LoRA checkpoint merged into its base generates what the adapter
path generates; the adapter alone exports in PEFT format; a full checkpoint is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from grpo_stream.cli.main import app
from grpo_stream.config import load_config
from grpo_stream.models.loading import load_policy, load_tokenizer
from grpo_stream.training.state import TrainState

PROMPTS = ["12+34=", "7+8="]


@pytest.fixture(scope="module")
def lora_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA trainer's checkpoint whose adapter moved as training moves it."""
    torch.set_num_threads(1)
    run_dir = tmp_path_factory.mktemp("run")
    cfg = load_config(
        None, [f"run.run_dir={json.dumps(str(run_dir))}", "trainer.lora.enabled=true"]
    )
    state = TrainState.create(cfg)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in state.model.named_parameters():
            if ".lora_" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
    path = state.checkpoint()
    assert path is not None
    return path


def greedy(model: Any, tokenizer: Any) -> list[list[int]]:
    out = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            tokens = model.generate(
                ids, max_new_tokens=32, min_new_tokens=32, do_sample=False, top_k=None, top_p=None
            )
        out.append(tokens[0, ids.shape[1] :].tolist())
    return out


def test_merged_export_generates_the_adapter_paths_tokens(
    lora_checkpoint: Path, tmp_path: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "merged"
    result = CliRunner().invoke(
        app, ["export", "--merge", "--dtype", "float32", str(lora_checkpoint), str(out)]
    )
    assert result.exit_code == 0, result.output
    assert not (out / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert not any(".lora_" in n for n, _ in merged.named_parameters())  # no peft needed
    tokenizer = load_tokenizer(str(out))
    config = json.loads((lora_checkpoint / "adapter_config.json").read_text())
    base = load_policy(config["base_model_name_or_path"], dtype="float32", trainable=False)
    adapter_path = PeftModel.from_pretrained(base, lora_checkpoint).eval()
    expected = greedy(adapter_path, tokenizer)
    assert [len(t) for t in expected] == [32, 32]
    assert greedy(merged, tokenizer) == expected
    with adapter_path.disable_adapter():
        assert greedy(adapter_path, tokenizer) != expected  # the adapter changes the output


def test_adapter_export_is_peft_format(lora_checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "adapter"
    result = CliRunner().invoke(app, ["export", str(lora_checkpoint), str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("adapter")) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    assert not (out / "trainer_state.pt").exists()


def test_a_full_weights_checkpoint_is_refused_in_one_line(tmp_path: Path) -> None:
    from grpo_stream.training.checkpoint import save_checkpoint

    model = load_policy("grpo-stream/tiny-arith", dtype="float32")
    ckpt = save_checkpoint(tmp_path / "run", 1, model, None, {"step": 1}, keep=1)
    result = CliRunner().invoke(app, ["export", "--merge", str(ckpt), str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "not a LoRA checkpoint" in result.output
    assert not (tmp_path / "out").exists()
