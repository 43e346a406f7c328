"""What runs without vLLM: the version gate (pre-flight refuses an old vLLM in one line), the
check that a version fits the model's checkpoint, the hand-off file, and per-group seeds.
The same gate on a real vLLM's API is in test_vllm_faults.py (marked gpu)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from grpo_stream.engines.streaming import group_seed, seeds
from grpo_stream.engines.vllm import compat as vllm_compat
from grpo_stream.engines.vllm.weights import CheckpointShapes, write_handoff
from grpo_stream.preflight import PreflightError, check_vllm


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("0.32.0", (0, 32, 0)), ("0.33.0rc1", (0, 33, 0)), ("0.9.0.1", (0, 9, 0)),
     ("1.0", (1, 0, 0)), ("0.32.0+cpu", (0, 32, 0)), ("0.10.1.1.post2", (0, 10, 1))],
)  # fmt: skip
def test_versions_parse_to_major_minor_patch(text: str, parsed: tuple[int, int, int]) -> None:
    assert vllm_compat.parse_version(text) == parsed


def test_a_vllm_older_than_the_minimum_is_refused_in_one_line() -> None:
    vllm_compat.check_version("0.32.0")
    vllm_compat.check_version("0.33.1")
    with pytest.raises(vllm_compat.UnsupportedVLLM, match=r"vLLM 0\.31\.0 is not supported") as err:
        vllm_compat.check_version("0.31.0")
    assert "\n" not in str(err.value) and "vLLM >= 0.32.0" in str(err.value)
    assert "generator.engine = 'hf'" in str(err.value)


def test_missing_apis_are_named_in_the_refusal() -> None:
    vllm_compat.require(vllm_compat.Support("0.32.0", ()))
    missing = ("CompletionOutput.weight_versions", "AsyncLLM.update_weight_version")
    with pytest.raises(vllm_compat.UnsupportedVLLM) as err:
        vllm_compat.require(vllm_compat.Support("0.26.0", missing))
    assert "lacks CompletionOutput.weight_versions, AsyncLLM.update_weight_version" in str(
        err.value
    )


def test_preflight_refuses_an_old_vllm_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(vllm_compat, "installed_version", lambda: "0.30.0")
    monkeypatch.setattr("grpo_stream.preflight.util.find_spec", lambda name: object())
    with pytest.raises(PreflightError, match=r"vLLM 0\.30\.0 is not supported") as err:
        check_vllm()
    assert "\n" not in str(err.value)


def test_preflight_says_when_vllm_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_compat, "installed_version", lambda: None)
    with pytest.raises(PreflightError, match="vLLM is not installed here"):
        check_vllm()


def _named(model: torch.nn.Module) -> list[tuple[str, np.ndarray]]:
    return [(n, p.detach().numpy()) for n, p in model.named_parameters()]


def test_a_whole_version_of_the_model_passes_the_checkpoint_check(tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    shapes = CheckpointShapes.of_directory(str(tiny_dir), tied=True)
    shapes.check(_named(model))  # the tied lm_head is not in the set: allowed


def test_the_checkpoint_check_names_the_tensor_that_does_not_fit(tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    named = _named(AutoModelForCausalLM.from_pretrained(tiny_dir))
    shapes = CheckpointShapes.of_directory(str(tiny_dir), tied=True)
    with pytest.raises(ValueError, match=r"'model.norm.weight' has shape \(3,\)"):
        shapes.check([(n, np.zeros(3) if n == "model.norm.weight" else a) for n, a in named])
    with pytest.raises(ValueError, match=r"'extra.weight', unknown to the model"):
        shapes.check([*named, ("extra.weight", np.zeros(2))])
    with pytest.raises(ValueError, match=r"incomplete: 1 tensors missing, e.g. 'model.norm"):
        shapes.check([(n, a) for n, a in named if n != "model.norm.weight"])
    untied = CheckpointShapes(dict(shapes.shapes, **{"lm_head.weight": (45, 64)}), tied=False)
    with pytest.raises(ValueError, match=r"'lm_head\.weight'"):
        untied.check(named)


def test_the_hand_off_file_holds_each_shared_tensor_once(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    embed = torch.randn(4, 3)
    path, names = write_handoff(
        [("embed", embed), ("head", embed), ("norm", np.ones(3, np.float32))], version=7
    )
    try:
        assert names == ["embed", "norm"]
        held = load_file(str(path))
        assert torch.equal(held["embed"], embed) and torch.equal(held["norm"], torch.ones(3))
        assert path.name.startswith("grpo-v7-")
    finally:
        path.unlink()


def test_a_group_is_seeded_by_its_id_not_by_how_it_was_batched() -> None:
    assert group_seed(0, 5) == group_seed(0, 5)
    assert len({group_seed(0, g) for g in range(100)}) == 100
    assert group_seed(1, 5) != group_seed(0, 5)
    assert seeds(3, 4) == seeds(3, 4) and seeds(None, 2) == [None, None]
