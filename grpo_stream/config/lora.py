"""`trainer.lora`: train and publish a peft adapter instead of all weights."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

LORA_LR = 2e-3
"""trainer.lr when trainer.lora.enabled and trainer.lr is not given: the best of the lrs
searched by bench.lora on the embedded task (r 16, alpha 32; bench/results/lora_reward.json)."""
DEFAULT_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
"""Attention and MLP projections of Llama/Qwen/Mistral-style decoders."""


class LoraSettings(BaseModel):
    """LoRA training: the trainer trains (and publishes) a peft adapter, the base stays frozen."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    enabled: bool = False
    """Train a LoRA adapter instead of all weights; versions carry only the adapter."""
    r: int = Field(16, ge=1, le=1024)
    """Adapter rank."""
    alpha: int = Field(32, ge=1)
    """LoRA alpha: the adapter's update is scaled by alpha / r."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapter's input while training (none at generation)."""
    target_modules: list[str] = Field(default_factory=lambda: list(DEFAULT_TARGETS), min_length=1)
    """Module names (peft suffix match) that get an adapter: attention and MLP projections."""

    @property
    def scaling(self) -> float:
        return self.alpha / self.r
