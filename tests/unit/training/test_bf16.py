"""trainer.precision = "bf16": bf16 weights, float32 moments, Kahan-compensated updates.

Stated tolerances. KahanAdamW against torch.optim.AdamW in float32 on the same gradients:
the bf16 weight stays within one bf16 rounding (half an ulp, 2^-9 relative, +5% for the
compensation buffer's own rounding) of the fp32 trajectory, while plain bf16 AdamW loses
every update below half an ulp. A real train step of the tiny model in bf16 against fp32
from the same weights: loss within 2% relative; the weight change of 3 steps has cosine
>= 0.95 with fp32's and a norm within 25% of it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_stream.config import ConfigError, load_config
from grpo_stream.training.bf16 import KahanAdamW
from grpo_stream.training.device import CudaProbe, resolve

sys.path.insert(0, str(Path(__file__).parent))
from trainstates import make_batch, make_state, params_of, rolled_back

BF16 = ('trainer.precision="bf16"', 'model.dtype="auto"')


def _adamw_run(optimizer_cls: Any, dtype: torch.dtype, steps: int) -> torch.Tensor:
    torch.manual_seed(0)
    # the same bf16-representable start and gradients for every run: only rounding differs
    start = (1.0 + torch.rand(256) * 0.5).to(torch.bfloat16)  # [1, 1.5): half an ulp 2^-8
    p = torch.nn.Parameter(start.to(dtype))
    opt = optimizer_cls([p], lr=1e-4, weight_decay=0.0)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        grad = (torch.randn(256, generator=g) - 0.5).to(torch.bfloat16)  # biased: a drift
        p.grad = grad.to(dtype)
        opt.step()
    return p.detach().float()


def test_kahan_adamw_follows_fp32_adamw_where_plain_bf16_loses_the_updates() -> None:
    reference = _adamw_run(torch.optim.AdamW, torch.float32, 300)
    kahan = _adamw_run(KahanAdamW, torch.bfloat16, 300)
    plain = _adamw_run(torch.optim.AdamW, torch.bfloat16, 300)
    start = _adamw_run(torch.optim.AdamW, torch.float32, 0)
    assert float((reference - start).abs().mean()) > 0.01  # fp32 moved several half-ulps
    # half an ulp in [1, 2), plus 5% for the compensation buffer's own bf16 rounding
    assert float((kahan - reference).abs().max()) <= 1.05 * 2**-8
    assert float((plain - reference).abs().mean()) > 0.01  # the premise: bf16 rounds it away


def test_kahan_adamw_moments_stay_float32_through_a_state_dict_round_trip() -> None:
    p = torch.nn.Parameter(torch.ones(8, dtype=torch.bfloat16))
    opt = KahanAdamW([p], lr=1e-3)
    p.grad = torch.full((8,), 0.3, dtype=torch.bfloat16)
    opt.step()
    saved = opt.state_dict()
    other = KahanAdamW([p], lr=1e-3)
    other.load_state_dict(saved)
    for key in ("exp_avg", "exp_avg_sq"):
        loaded = other.state[p][key]
        assert loaded.dtype == torch.float32
        assert torch.equal(loaded, saved["state"][0][key])
    assert other.state[p]["compensation"].dtype == torch.bfloat16


def test_bf16_step_matches_fp32_within_the_stated_tolerance(tmp_path: Path) -> None:
    full = make_state(tmp_path / "fp32")
    half = make_state(tmp_path / "bf16", *BF16)
    assert {p.dtype for p in half.model.parameters()} == {torch.bfloat16}
    before32, before16 = params_of(full), params_of(half)
    losses = []
    for step in range(3):
        batch = make_batch(step, seed=step)
        r32, r16 = full.train_step(batch), half.train_step(batch)
        assert r32.applied and r16.applied
        losses.append((r32.metrics["loss"], r16.metrics["loss"]))
    loss32, loss16 = losses[0]
    assert abs(loss16 - loss32) <= 0.02 * abs(loss32)
    d32 = torch.cat([(p - before32[n]).flatten() for n, p in params_of(full).items()])
    d16 = torch.cat(
        [(p.float() - before16[n].float()).flatten() for n, p in params_of(half).items()]
    )
    assert float(d16.norm()) > 0  # the bf16 weights changed
    cosine = float(torch.nn.functional.cosine_similarity(d32, d16, dim=0))
    assert cosine >= 0.95
    assert abs(float(d16.norm()) / float(d32.norm()) - 1) <= 0.25
    for state in half.optimizer.state.values():
        assert state["exp_avg"].dtype == torch.float32
        assert state["exp_avg_sq"].dtype == torch.float32


def test_bf16_resume_restores_weights_and_float32_moments(tmp_path: Path) -> None:
    state = make_state(tmp_path / "run", *BF16)
    for step in range(2):
        assert state.train_step(make_batch(step, seed=step)).applied
    state.checkpoint()
    resumed = make_state(tmp_path / "run", *BF16, resume=True)
    assert resumed.step == 2
    for name, p in params_of(resumed).items():
        assert p.dtype == torch.bfloat16 and torch.equal(p, params_of(state)[name])
    for a, b in zip(state.optimizer.state.values(), resumed.optimizer.state.values(), strict=True):
        for key in ("exp_avg", "exp_avg_sq", "compensation"):
            assert b[key].dtype == a[key].dtype and torch.equal(a[key], b[key])


def test_bf16_rollback_restores_weights_and_compensation(tmp_path: Path) -> None:
    state = make_state(tmp_path / "run", *BF16, "trainer.fault_nan_step=2")
    weights, kept = rolled_back(state, 2, "compensation")
    for name, p in params_of(state).items():
        assert torch.equal(p, weights[name])
    for s, c in zip(state.optimizer.state.values(), kept, strict=True):
        assert torch.equal(s["compensation"], c) and s["exp_avg"].dtype == torch.float32


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (['model.dtype="float32"'], "model.dtype"),
        (["trainer.lora.enabled=true"], "trainer.lora.enabled"),
        (["trainer.ranks=2", 'trainer.parallel="fsdp2"'], 'trainer.parallel = "fsdp2"'),
    ],
)
def test_bf16_refuses_a_bad_combination_in_one_line(
    tmp_path: Path, overrides: list[str], named: str
) -> None:
    cfg = load_config(
        None,
        [f"run.run_dir={json.dumps(str(tmp_path))}", 'trainer.precision="bf16"', *overrides],
    )
    with pytest.raises(ConfigError, match=r"trainer\.precision") as err:
        resolve(cfg, lambda: CudaProbe(False))
    assert named in str(err.value) and "\n" not in str(err.value)


def test_bf16_on_a_gpu_without_bf16_is_refused(tmp_path: Path) -> None:
    cfg = load_config(
        None,
        [
            f"run.run_dir={json.dumps(str(tmp_path))}",
            'trainer.precision="bf16"',
            'trainer.device="cuda"',
        ],
    )
    with pytest.raises(ConfigError, match="no bfloat16 support"):
        resolve(cfg, lambda: CudaProbe(True, 1, bf16=False))
