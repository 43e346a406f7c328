"""Grouped rows (a prompt and all its completions in one row, a 4D mask) against each
sequence's own forward: values, entropies and gradients, on tiny Qwen2 (sdpa and eager)
and GPT-2; the mask's structure; the model check; the width rule."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_stream.algo.grouped import (
    attention_share,
    build_rows,
    grouped_logprobs,
    rows_width,
    rows_work,
)
from grpo_stream.algo.logprobs import SharedLayout
from grpo_stream.models import testing

sys.path.insert(0, str(Path(__file__).parent))
from shared_layouts import PROMPT_OF, PROMPTS, assert_same_grads, grads, shared_layout

COMPLETIONS = [[5, 6, 2], [7], [8, 9, 4, 6], [11, 12], [13, 3, 2], [14, 15, 1, 2, 3, 4]]
Case = tuple[list[list[int]], list[list[int]], list[int]]
CASES: dict[str, Case] = {
    "one group a row": (PROMPTS, COMPLETIONS, PROMPT_OF),  # groups of 11, 10 and 7 tokens
    "groups share a row": (  # groups of 11, 3 and 5 tokens: the two short ones share a row
        [[1, 10, 11], [2], [3, 4]],
        [[5, 6, 2], [7, 8, 9, 4, 6], [13, 3], [14], [15, 1]],
        [0, 0, 1, 2, 2],
    ),
}


def layout(case: Case = CASES["one group a row"]) -> SharedLayout:
    return shared_layout(*case)


def own_forward(
    model: Any, temperature: float, case: Case
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per sequence, alone (no padding, no mask): log p(c_j | prompt, c_<j) of the tempered
    softmax and its entropy, straight from the definition."""
    logps, entropies = [], []
    prompts, completions, prompt_of = case
    for s, completion in enumerate(completions):
        prompt = prompts[prompt_of[s]]
        seq = torch.tensor([prompt + completion])
        logits = model(input_ids=seq).logits[0].float() / temperature  # (L, V)
        at = logits[len(prompt) - 1 : len(seq[0]) - 1]  # the positions predicting c_0 .. c_n-1
        logp = torch.log_softmax(at, dim=-1)
        logps.append(logp.gather(1, torch.tensor(completion).unsqueeze(1)).squeeze(1))
        entropies.append(-(logp.exp() * logp).sum(dim=1).detach())
    return logps, entropies


def models() -> dict[str, Any]:
    return {
        "qwen2-sdpa": testing.tiny_qwen2(16, 0, hidden=16, intermediate=32),
        "qwen2-eager": testing.tiny_qwen2(
            16, 0, hidden=16, intermediate=32, attn_implementation="eager"
        ),
        "gpt2": testing.tiny_gpt2(16, 0),
    }


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", ["qwen2-sdpa", "qwen2-eager", "gpt2"])
@pytest.mark.parametrize("chunk", [1, 2, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rows_give_each_sequences_own_logprobs(
    case: str, name: str, chunk: int, temperature: float
) -> None:
    torch.set_num_threads(1)
    model = models()[name]
    want, want_ent = own_forward(model, temperature, CASES[case])
    logp, ent = grouped_logprobs(model, layout(CASES[case]), chunk=chunk,
                                 temperature=temperature)  # fmt: skip
    for s, completion in enumerate(CASES[case][1]):
        n = len(completion)
        torch.testing.assert_close(logp[s, :n], want[s], rtol=0, atol=1e-5)
        torch.testing.assert_close(ent[s, :n], want_ent[s], rtol=0, atol=1e-5)
        assert bool((logp[s, n:] == 0).all()) and bool((ent[s, n:] == 0).all())


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", ["qwen2-sdpa", "gpt2"])
def test_rows_give_each_sequences_own_gradients(case: str, name: str) -> None:
    torch.set_num_threads(1)
    model = models()[name]
    weights = torch.linspace(-1.0, 1.0, len(CASES[case][1]))  # every sequence its own weight
    want, _ = own_forward(model, 0.7, CASES[case])
    sum(w * lp.sum() for w, lp in zip(weights, want, strict=True)).backward()  # type: ignore[union-attr]
    expected = grads(model)
    logp, _ = grouped_logprobs(model, layout(CASES[case]), chunk=2, temperature=0.7)
    (logp * weights.unsqueeze(1)).sum().backward()
    assert_same_grads(grads(model), expected, rel=1e-5)


def test_a_completion_sees_its_prompt_and_itself_only() -> None:
    data = layout()
    rows = build_rows(data)
    row = 0  # prompt [1, 10, 11], completions [5, 6, 2], [7], [8, 9, 4, 6]
    assert rows.input_ids[row].tolist() == [1, 10, 11, 5, 6, 2, 7, 8, 9, 4, 6]
    assert rows.position_ids[row].tolist() == [0, 1, 2, 3, 4, 5, 3, 3, 4, 5, 6]
    allowed = rows.allowed[row, 0]
    sees = {q: [k for k in range(allowed.shape[1]) if allowed[q, k]] for q in range(11)}
    assert sees[1] == [0, 1]  # a prompt token: the prompt before it
    assert sees[5] == [0, 1, 2, 3, 4, 5]  # completion 0's last token: prompt + completion 0
    assert sees[6] == [0, 1, 2, 6]  # completion 1: not completion 0
    assert sees[9] == [0, 1, 2, 7, 8, 9]  # completion 2: not 0, not 1
    # row 2: prompt [3], one completion; its pads see only themselves
    short = rows.allowed[2, 0]
    width = short.shape[0]
    for q in range(1 + 6, width):
        assert [k for k in range(width) if short[q, k]] == [q]
    assert rows.input_ids.shape[1] == max(
        len(PROMPTS[u]) + sum(len(c) for s, c in enumerate(COMPLETIONS) if PROMPT_OF[s] == u)
        for u in range(len(PROMPTS))
    )


def test_rows_work_on_transformers_models() -> None:
    for model in models().values():
        assert rows_work(model)


def test_a_model_that_ignores_the_mask_fails_the_check() -> None:
    class OwnCausalMask(torch.nn.Module):
        """Drops the 4D mask and the position ids: completions would see each other."""

        def __init__(self) -> None:
            super().__init__()
            self.inner = testing.tiny_qwen2(16, 0, hidden=16, intermediate=32)
            self.config = self.inner.config

        def forward(self, input_ids: Any, attention_mask: Any = None, **kw: Any) -> Any:
            return self.inner(input_ids=input_ids, use_cache=False)

    assert not rows_work(OwnCausalMask())


def test_chunk_must_be_positive() -> None:
    with pytest.raises(ValueError, match="chunk"):
        grouped_logprobs(models()["gpt2"], layout(), chunk=0)


def test_attention_share_is_the_ratio_of_the_formula() -> None:
    qwen = testing.qwen2_config(16, hidden=128, intermediate=640)
    assert attention_share(304, qwen) == pytest.approx(2 * 304 / (4 * 128 + 3 * 640))
    assert rows_width(qwen) == 304  # 0.25 at W = 304, above at 305
    assert attention_share(304, qwen) <= 0.25 < attention_share(305, qwen)
    gpt2 = testing.tiny_gpt2(16, 0).config  # n_embd 16, n_inner None: 4 x n_embd
    assert attention_share(10, gpt2) == pytest.approx(20 / (64 + 3 * 64))


def test_short_groups_share_a_row_and_never_see_each_other() -> None:
    rows = build_rows(layout(CASES["groups share a row"]))
    assert rows.input_ids.shape == (2, 11)  # 11 | 3 + 5 (+ 3 pads)
    assert rows.input_ids[1, :8].tolist() == [3, 4, 14, 15, 1, 2, 13, 3]  # longest first
    assert rows.position_ids[1, :8].tolist() == [0, 1, 2, 2, 3, 0, 1, 2]
    allowed = rows.allowed[1, 0]
    sees = {q: [k for k in range(11) if allowed[q, k]] for q in range(11)}
    assert sees[4] == [0, 1, 3, 4]  # [15, 1]'s 1: its prompt [3, 4] and itself, not [14]
    assert sees[5] == [5]  # the second group's prompt [2]: nothing of the first group
    assert sees[7] == [5, 6, 7]  # [13, 3]'s 3: its prompt [2] and itself
    assert rows.row.tolist() == [0, 0, 1, 1, 1]
