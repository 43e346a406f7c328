"""The hf engine's turn cache (KV kept between the turns of episodes) on a real tiny Qwen2.

Reference: a fresh, unpadded forward of each row's final trajectory (prompt, every sampled
turn, every observation), log_softmax(logits / T) of each sampled token.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from structlog.testing import capture_logs

from grpo_stream.engines.hf import HFEngine
from grpo_stream.engines.turn_cache import TurnCache
from grpo_stream.sampling import Completion, Sampling

PROMPTS = ["1", "12+34=", "7*8=?", "100-1=abc de"]  # uneven lengths: 1 to 12 tokens
OBSERVATIONS = ["", "x", "abc", "h? lower"]  # 0 to 8 tokens, one per row


@pytest.fixture
def ends_early(hf_engine: HFEngine, tokenizer: Any) -> Iterator[HFEngine]:
    """The engine's model with <eos> made likely (a bias on its logit at the output), so
    rows end at different steps of a turn and the decode loop leaves holes in the cache."""

    def hook(module: Any, args: Any, output: torch.Tensor) -> torch.Tensor:
        output = output.clone()
        output[..., tokenizer.eos_token_id] += 2.5
        return output

    handle = hf_engine.model.lm_head.register_forward_hook(hook)
    yield hf_engine
    handle.remove()


def fresh_logprobs(model: Any, row: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) at every position of one unpadded forward of `row`."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([row])).logits[0].float()  # (T, V)
    return torch.log_softmax(logits / temperature, dim=-1)


def play(
    complete: Any, tokenizer: Any, keys: list[int], turns: int, temperature: float = 0.7
) -> dict[int, tuple[list[int], list[tuple[int, int, float]]]]:
    """`turns` turns of every key: the row grows by the sampled ids and then an observation;
    returns per key its final row and (position, token, behaviour log-prob) per sampled token."""
    prompts = tokenizer(PROMPTS)["input_ids"]
    rows = {k: list(prompts[k % len(prompts)]) for k in keys}
    sampled: dict[int, list[tuple[int, int, float]]] = {k: [] for k in keys}
    for turn in range(turns):
        got = complete(keys, [rows[k] for k in keys], Sampling(5, temperature, seed=11 + turn))
        for k, c in zip(keys, got, strict=True):
            start = len(rows[k])
            sampled[k] += [
                (start + j, t, lp)
                for j, (t, lp) in enumerate(zip(c.token_ids, c.logprobs, strict=True))
            ]
            obs = OBSERVATIONS[(k + turn) % len(OBSERVATIONS)]
            rows[k] += c.token_ids + tokenizer(obs, add_special_tokens=False)["input_ids"]
    return {k: (rows[k], sampled[k]) for k in keys}


def stateless(engine: HFEngine) -> Any:
    return lambda keys, rows, sampling: engine.complete(rows, sampling)


def max_gap_to_fresh_forward(engine: HFEngine, played: dict[int, Any], temperature: float) -> float:
    gap = 0.0
    for row, sampled in played.values():
        logp = fresh_logprobs(engine.model, row, temperature)
        for pos, tok, lp in sampled:
            gap = max(gap, abs(float(logp[pos - 1, tok]) - lp))
    return gap


def assert_same_completions(got: list[Completion], expected: list[Completion]) -> None:
    """The same tokens, and log-probs within 1e-5 (the cache's and a fresh forward's)."""
    assert [c.token_ids for c in got] == [c.token_ids for c in expected]
    gaps = [
        abs(a - b)
        for x, y in zip(got, expected, strict=True)
        for a, b in zip(x.logprobs, y.logprobs, strict=True)
    ]
    assert max(gaps) < 1e-5


def test_logprobs_of_a_3_turn_episode_with_kv_reuse_equal_a_fresh_forward(
    ends_early: HFEngine, tokenizer: Any
) -> None:
    session = ends_early.open_turns()
    played = play(session.complete, tokenizer, keys=[0, 1, 2, 3, 4, 5], turns=3)
    lengths = [len(s) for _, s in played.values()]
    assert min(lengths) >= 3 and len(set(lengths)) > 1  # rows ended at different steps
    assert max_gap_to_fresh_forward(ends_early, played, 0.7) < 1e-5


def test_a_turn_prefills_only_the_tokens_appended_since_the_last(
    hf_engine: HFEngine, tokenizer: Any
) -> None:
    session = hf_engine.open_turns()
    keys = [0, 1, 2, 3]
    first = [len(ids) for ids in tokenizer(PROMPTS)["input_ids"]]
    played = play(session.complete, tokenizer, keys, turns=1)
    assert session.prefilled == sum(first)
    rows = [played[k][0] for k in keys]
    grown = [
        len(r) - len(tokenizer(PROMPTS)["input_ids"][k]) for k, r in zip(keys, rows, strict=True)
    ]
    session.complete(keys, rows, Sampling(5, temperature=0.7, seed=0))
    # at most the appended tokens (the observation and the last sampled token, whose KV the
    # decode loop never computed) plus one: a row with nothing new runs its last token again
    added = session.prefilled - sum(first)
    assert 0 < added <= sum(grown) + len(keys)
    assert added < sum(len(r) for r in rows)


def test_kv_reuse_samples_the_tokens_the_stateless_path_samples(
    ends_early: HFEngine, tokenizer: Any
) -> None:
    keys = [0, 1, 2, 3, 4, 5, 6, 7]
    reused = play(ends_early.open_turns().complete, tokenizer, keys, turns=3)
    fresh = play(stateless(ends_early), tokenizer, keys, turns=3)
    for k in keys:
        assert reused[k][0] == fresh[k][0]
        gaps = [abs(a[2] - b[2]) for a, b in zip(reused[k][1], fresh[k][1], strict=True)]
        assert max(gaps) < 1e-5


def test_ended_episodes_are_dropped_from_the_cache(hf_engine: HFEngine, tokenizer: Any) -> None:
    session = hf_engine.open_turns()
    rows = {k: r for k, r in enumerate(tokenizer(PROMPTS)["input_ids"])}
    got = session.complete([0, 1, 2, 3], [rows[k] for k in range(4)], Sampling(4, seed=1))
    assert session.rows == 4
    for k, c in zip(range(4), got, strict=True):
        rows[k] = rows[k] + c.token_ids + tokenizer("ab", add_special_tokens=False)["input_ids"]
    live = [3, 1]  # 0 and 2 ended; the order may change too
    again = session.complete(live, [rows[k] for k in live], Sampling(4, seed=2))
    assert session.rows == 2
    expected = hf_engine.complete([rows[k] for k in live], Sampling(4, seed=2))
    assert [c.token_ids for c in again] == [c.token_ids for c in expected]
    for k, c in zip(live, again, strict=True):
        logp = fresh_logprobs(hf_engine.model, rows[k] + c.token_ids, 1.0)
        start = len(rows[k])
        for j, (t, lp) in enumerate(zip(c.token_ids, c.logprobs, strict=True)):
            assert abs(float(logp[start + j - 1, t]) - lp) < 1e-5
    session.close()
    assert session.rows == 0


def test_a_row_with_nothing_new_samples_as_from_a_fresh_prefill(
    hf_engine: HFEngine, tokenizer: Any
) -> None:
    """A row whose every token is cached (it ended with <eos> before the last step and the
    environment answered nothing) runs its last token again to get the next logits."""
    session = hf_engine.open_turns()
    rows = tokenizer(PROMPTS)["input_ids"]
    session.complete([0, 1, 2, 3], rows, Sampling(1, seed=3))  # one step: nothing of it cached
    session.complete([0, 1, 2, 3], rows, Sampling(1, seed=3))  # the same rows: all cached
    again = session.complete([0, 1, 2, 3], rows, Sampling(4, seed=4))
    expected = hf_engine.complete(rows, Sampling(4, seed=4))
    assert_same_completions(again, expected)


def test_a_new_weights_version_drops_the_cache(hf_engine: HFEngine, tokenizer: Any) -> None:
    session: TurnCache = hf_engine.open_turns()
    rows = tokenizer(PROMPTS)["input_ids"]
    got = session.complete([0, 1, 2, 3], rows, Sampling(4, seed=5))
    rows = [r + c.token_ids for r, c in zip(rows, got, strict=True)]
    gen = torch.Generator().manual_seed(1)
    new = [
        (name, (p.detach() + 0.05 * torch.randn(p.shape, generator=gen)).numpy())
        for name, p in hf_engine.model.named_parameters()
    ]
    hf_engine.load_weights(new, version=1)
    with capture_logs() as logs:
        again = session.complete([0, 1, 2, 3], rows, Sampling(4, seed=6))
    assert [e["reason"] for e in logs if e["event"] == "turns.cache_dropped"] == ["weights changed"]
    for r, c in zip(rows, again, strict=True):  # the new weights' numbers, not the old KV's
        logp = fresh_logprobs(hf_engine.model, r + c.token_ids, 1.0)
        for j, (t, lp) in enumerate(zip(c.token_ids, c.logprobs, strict=True)):
            assert abs(float(logp[len(r) + j - 1, t]) - lp) < 1e-5
    assert all(c.version_runs == [(0, 1)] for c in again)


def test_a_row_that_does_not_extend_its_cached_ids_is_prefilled_whole(
    hf_engine: HFEngine, tokenizer: Any
) -> None:
    session = hf_engine.open_turns()
    rows = tokenizer(PROMPTS)["input_ids"]
    session.complete([0, 1, 2, 3], rows, Sampling(3, seed=7))
    other = [[*reversed(r), 5] for r in rows]
    with capture_logs() as logs:
        got = session.complete([0, 1, 2, 3], other, Sampling(3, seed=8))
    assert any(e["event"] == "turns.cache_dropped" for e in logs)
    expected = hf_engine.complete(other, Sampling(3, seed=8))
    assert [c.token_ids for c in got] == [c.token_ids for c in expected]


def test_the_first_turn_prefills_each_distinct_row_once(
    ends_early: HFEngine, tokenizer: Any
) -> None:
    """G episodes of a prompt start from equal rows: one prefill per distinct row, and every
    copy then samples on its own, as the stateless path samples (same seed)."""
    prompts = tokenizer(PROMPTS[1:])["input_ids"]
    rows = [p for p in prompts for _ in range(4)]  # 3 prompts x 4 episodes
    session = ends_early.open_turns()
    got = session.complete(list(range(12)), rows, Sampling(5, seed=9))
    assert session.prefilled == sum(len(p) for p in prompts)
    expected = ends_early.complete(rows, Sampling(5, seed=9))
    assert_same_completions(got, expected)
    assert len({tuple(c.token_ids) for c in got}) > 3  # the copies sampled differently


def test_episodes_that_played_alike_are_fed_once(hf_engine: HFEngine, tokenizer: Any) -> None:
    """Rows equal after a turn (here every row sampled <eos> and got the same answer) are
    fed once; each copy then samples on its own, its log-probs a fresh forward's."""
    eos = tokenizer.eos_token_id

    def only_eos(module: Any, args: Any, output: torch.Tensor) -> torch.Tensor:
        output = output.clone()
        output[..., eos] += 100.0
        return output

    prompt = tokenizer(PROMPTS[1])["input_ids"]
    session = hf_engine.open_turns()
    handle = hf_engine.model.lm_head.register_forward_hook(only_eos)
    got = session.complete(list(range(6)), [prompt] * 6, Sampling(3, seed=1))
    handle.remove()
    assert all(c.token_ids == [eos] for c in got)
    answer = tokenizer("abc", add_special_tokens=False)["input_ids"]
    rows = [[*prompt, eos, *answer]] * 6
    before = session.prefilled
    again = session.complete(list(range(6)), rows, Sampling(5, seed=2))
    # one copy fed: its <eos> (the last step's token: its KV never computed) and the answer
    assert session.prefilled - before == 1 + len(answer)
    assert len({tuple(c.token_ids) for c in again}) > 1
    logp = [fresh_logprobs(hf_engine.model, rows[0] + c.token_ids, 1.0) for c in again]
    for lp, c in zip(logp, again, strict=True):
        for j, (t, b) in enumerate(zip(c.token_ids, c.logprobs, strict=True)):
            assert abs(float(lp[len(rows[0]) + j - 1, t]) - b) < 1e-5
