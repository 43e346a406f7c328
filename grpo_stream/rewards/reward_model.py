"""reward_model: a learned reward, a transformers sequence-classification model with one label.

`RewardModel.load(path)` loads the model once per reward worker; the reward of a completion is
the model's single logit on `prompt + completion` (truncated from the left to `max_length`
tokens, so the completion's end is always seen). `score_batch` scores many completions of one
prompt in batches of `batch_size` (the sandbox calls it once per chunk); `device = "auto"` puts
the model on the GPU when one is visible to the scorer.

Invariants: a head with other than one label is refused when the model is loaded (and by
`check_head`, which reads only the config, before a run starts); scores are finite floats or
the call raises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpo_stream.rewards.errors import RewardLoadError


def check_head(path: str) -> None:
    """Refuse a model whose classification head has other than one label (config only)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise RewardLoadError(f"reward_model {path}: cannot read its config: {exc}") from None
    labels = int(config.num_labels)
    if labels != 1:
        raise RewardLoadError(
            f"reward_model {path}: its head has {labels} labels; a reward model has exactly "
            "one (AutoModelForSequenceClassification with num_labels=1)"
        )


@dataclass
class RewardModel:
    """A loaded reward model, callable like any reward function."""

    model: Any
    tokenizer: Any
    device: str
    batch_size: int
    max_length: int

    @classmethod
    def load(
        cls, path: str, device: str = "auto", batch_size: int = 16, max_length: int = 1024
    ) -> RewardModel:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if batch_size < 1 or max_length < 1:
            raise RewardLoadError(f"reward_model {path}: batch_size and max_length must be >= 1")
        check_head(path)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        tokenizer = AutoTokenizer.from_pretrained(path)
        tokenizer.truncation_side = "left"
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        model = AutoModelForSequenceClassification.from_pretrained(path).to(device).eval()
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        return cls(model, tokenizer, device, batch_size, max_length)

    def __call__(self, completion: str, *, prompt: str, reference: dict[str, Any]) -> float:
        return self.score_batch([completion], prompt=prompt, reference=reference)[0]

    def score_batch(
        self, completions: list[str], *, prompt: str, reference: dict[str, Any]
    ) -> list[float]:
        """The logit of each `prompt + completion`, computed `batch_size` at a time."""
        import torch

        scores: list[float] = []
        for start in range(0, len(completions), self.batch_size):
            texts = [prompt + c for c in completions[start : start + self.batch_size]]
            batch = self.tokenizer(
                texts,
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=self.max_length,
            ).to(self.device)
            with torch.inference_mode():
                logits = self.model(**batch).logits  # (B, 1)
            scores += [float(v) for v in logits[:, 0].float().cpu()]
        return scores
