"""`grpo-stream up` with trainer.lora.enabled: real processes train an adapter, publish only
the adapter, and the generator applies each version."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from safetensors.torch import load_file

from grpo_stream.training.metrics import read_metrics

from .conftest import SMALL, up_command

pytestmark = pytest.mark.slow  # one `up` run of a few steps (about 40 s on a loaded box)
STEPS = 6
LORA = ["--set", "trainer.lora.enabled=true", "--set", "trainer.lr=2e-3"]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    run_dir = tmp_path_factory.mktemp("up-lora") / "run"
    cmd = up_command(run_dir, STEPS, *LORA, settings=[*SMALL, "--set", "algo.loss.beta=0.02"])
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir, result.stderr


def test_every_step_trains_and_versions_advance(lora_run: tuple[Path, str]) -> None:
    rows = read_metrics(lora_run[0])
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert rows[-1]["policy_version"] == STEPS


def test_the_checkpoint_is_a_trained_adapter(lora_run: tuple[Path, str]) -> None:
    ckpt = lora_run[0] / "checkpoints" / f"step-{STEPS}"
    assert (ckpt / "COMPLETE").exists() and not (ckpt / "model.safetensors").exists()
    config = json.loads((ckpt / "adapter_config.json").read_text())
    assert config["r"] == 16
    tensors = load_file(str(ckpt / "adapter_model.safetensors"))
    assert any("lora_B" in n and bool(t.abs().sum() > 0) for n, t in tensors.items())


def _events(run_dir: Path, service: str, event: str) -> list[dict[str, object]]:
    rows = []
    for path in (run_dir / "logs").glob(f"{service}-*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("event") == event:
                rows.append(row)
    return rows


def test_only_the_adapter_travels_and_the_generator_applies_it(
    lora_run: tuple[Path, str],
) -> None:
    from grpo_stream.models.loading import load_policy

    run_dir = lora_run[0]
    full_mb = sum(p.numel() * 4 for p in load_policy("grpo-stream/tiny-arith").parameters()) / 2**20
    published = [
        float(str(r["mb"])) for r in _events(run_dir, "trainer", "weights.published") if "mb" in r
    ]
    assert published and max(published) < 0.25 * full_mb
    assert _events(run_dir, "generator", "engine.lora_injected")
    applied = [r["version"] for r in _events(run_dir, "generator", "engine.weights_loaded")]
    assert len(applied) >= 2 and max(applied) > 0  # type: ignore[type-var]
