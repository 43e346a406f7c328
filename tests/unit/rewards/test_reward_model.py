"""reward_model: a tiny sequence-classification model built here scores completions, in the
scorer's sandbox too, with batching; a head with more than one label is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from grpo_stream.config.tasks import RewardSpec
from grpo_stream.rewards import RewardLoadError, load_reward
from grpo_stream.rewards.reward_model import RewardModel
from grpo_stream.rewards.sandbox import RewardPool

TINY = Path(__file__).parents[3] / "grpo_stream" / "assets" / "tiny-arith"


def build_classifier(path: Path, labels: int = 1) -> Path:
    import torch
    from transformers import AutoTokenizer, Qwen2ForSequenceClassification

    from grpo_stream.models.testing import qwen2_config

    torch.manual_seed(0)
    config = qwen2_config(260, hidden=32, kv_heads=2, num_labels=labels, pad_token_id=0)
    Qwen2ForSequenceClassification(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(TINY).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_classifier(tmp_path_factory.mktemp("rm"))


def test_reward_model_scores_are_the_models_logits(classifier: Path) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    fn = load_reward(RewardSpec(name="reward_model", path=str(classifier)))
    model = AutoModelForSequenceClassification.from_pretrained(classifier).eval()
    ids = AutoTokenizer.from_pretrained(classifier)("1+2=3", return_tensors="pt")
    with torch.no_grad():
        want = float(model(**ids).logits[0, 0])
    assert fn("3", prompt="1+2=", reference={}) == pytest.approx(want, abs=1e-5)


def test_batched_scores_match_one_at_a_time(classifier: Path) -> None:
    rm = RewardModel.load(str(classifier), device="cpu", batch_size=2)
    texts = ["3", "12", "7777", ""]
    batched = rm.score_batch(texts, prompt="1+2=", reference={})
    single = [rm(t, prompt="1+2=", reference={}) for t in texts]
    assert batched == pytest.approx(single, abs=1e-5)
    assert len(set(np.round(batched, 6))) > 1  # different texts, different scores


@pytest.mark.slow
def test_reward_model_runs_in_the_sandbox_batched(classifier: Path) -> None:
    spec = RewardSpec(name="reward_model", path=str(classifier), params={"device": "cpu"})
    rm = RewardModel.load(str(classifier), device="cpu")
    completions = ["3", "4", "33"]
    with RewardPool([spec], workers=1, timeout_s=30, memory_limit_mb=512) as pool:
        result = pool.score("1+2=", completions, {"answer": "3"})
    assert result.errors == []
    want = rm.score_batch(completions, prompt="1+2=", reference={})
    assert result.rewards.tolist() == pytest.approx(want, abs=1e-4)


def test_a_head_with_two_labels_is_refused_in_one_line(tmp_path: Path) -> None:
    path = build_classifier(tmp_path / "two", labels=2)
    with pytest.raises(RewardLoadError, match="2 labels") as info:
        load_reward(RewardSpec(name="reward_model", path=str(path)))
    assert "\n" not in str(info.value)


def test_unknown_reward_model_params_are_refused(classifier: Path) -> None:
    with pytest.raises(RewardLoadError, match="params"):
        load_reward(RewardSpec(name="reward_model", path=str(classifier), params={"dev": "x"}))


def test_path_goes_only_with_reward_model() -> None:
    with pytest.raises(ValueError, match="path"):
        RewardSpec(name="exact_match", path="x")
    with pytest.raises(ValueError, match="path"):
        RewardSpec(name="reward_model")
