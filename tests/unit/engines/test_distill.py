"""The hf teacher against the autoregressive definition: log p(o_t | x, o_<t) of the tempered
softmax, each completion run alone through the model, no padding."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from grpo_stream.engines.distill import HFTeacher, TeacherError
from grpo_stream.models.testing import tiny_qwen2
from grpo_stream.protocols.distill import TeachRequest
from grpo_stream.services.teacher import answer


def reference(
    model: object, prompt: list[int], completion: list[int], temperature: float
) -> list[float]:
    """log softmax(logits / T) of each completion token, by the chain rule, one token at a time."""
    out = []
    ids = list(prompt)
    for token in completion:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].double()  # type: ignore[operator]
        z = logits / temperature
        log_norm = math.log(float(torch.exp(z - z.max()).sum())) + float(z.max())
        out.append(float(z[token]) - log_norm)
        ids.append(token)
    return out


@pytest.fixture(scope="module")
def model() -> object:
    return tiny_qwen2(vocab=20, hidden=32, layers=2, heads=2, kv_heads=1, positions=16, seed=3)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_hf_teacher_gives_each_completion_tokens_log_prob(
    model: object, temperature: float
) -> None:
    teacher = HFTeacher(model, "cpu", max_positions=16)
    prompt = np.array([1, 5, 7], np.int32)
    completions = [[3, 4, 9, 2], [8], [], [11, 12]]
    flat = np.array([t for c in completions for t in c], np.int32)
    offsets = np.cumsum([0] + [len(c) for c in completions]).astype(np.int64)
    got = teacher.logprobs(prompt, flat, offsets, temperature)
    want = [v for c in completions for v in reference(model, list(prompt), c, temperature)]
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_a_sequence_past_the_teachers_context_is_a_teacher_error(model: object) -> None:
    teacher = HFTeacher(model, "cpu", max_positions=16)
    with pytest.raises(TeacherError, match="exceeds the teacher's context"):
        teacher.logprobs(np.arange(10, dtype=np.int32), np.arange(8, dtype=np.int32),
                         np.array([0, 8]), 1.0)  # fmt: skip


def test_the_service_answers_an_engine_error_with_an_error_not_a_crash(model: object) -> None:
    request = TeachRequest(
        lease_id=4, group_id=9, prompt_ids=np.arange(10, dtype=np.int32),
        completion_ids=np.arange(8, dtype=np.int32), completion_offsets=np.array([0, 8]),
        temperature=1.0,
    )  # fmt: skip
    reply = answer(HFTeacher(model, "cpu", max_positions=16), request)
    assert (reply.lease_id, reply.group_id, reply.logprobs.size) == (4, 9, 0)
    assert "exceeds the teacher's context" in reply.error


def test_the_shipped_model_loads_as_a_teacher_and_scores_its_own_answer() -> None:
    teacher = HFTeacher.load("grpo-stream/tiny-arith", device="cpu")
    from grpo_stream.models.loading import load_tokenizer

    tok = load_tokenizer("grpo-stream/tiny-arith")
    prompt = np.array(tok("2+3=")["input_ids"], np.int32)
    right = np.array([*tok("5", add_special_tokens=False)["input_ids"], tok.eos_token_id], np.int32)
    wrong = np.array([*tok("9", add_special_tokens=False)["input_ids"], tok.eos_token_id], np.int32)
    got = teacher.logprobs(prompt, np.concatenate([right, wrong]), np.array([0, 2, 4]), 1.0)
    assert np.all(got <= 0) and got[0] > got[2]  # the warm-started model prefers 5 to 9
