"""The hub's content checks of an authenticated generator's Rollout, with the shipped tiny
model's real tokenizer: what an honest hf generator sends passes; texts that are not its ids,
ids outside the vocabulary, another prompt's ids, another name or sampling do not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from grpo_stream.config import RunConfig, config_from_dict
from grpo_stream.hub.content import ContentCheck
from grpo_stream.hub.dispatch import sampling_params
from grpo_stream.protocols import messages as m
from grpo_stream.tasks import make_task


@pytest.fixture(scope="module")
def cfg(tmp_path_factory: pytest.TempPathFactory) -> RunConfig:
    return config_from_dict({"run": {"run_dir": str(tmp_path_factory.mktemp("run"))}})


@pytest.fixture(scope="module")
def check(cfg: RunConfig) -> ContentCheck:
    return ContentCheck.load(cfg, make_task(cfg.task))


def honest(check: ContentCheck, cfg: RunConfig, gid: int = 3) -> m.Rollout:
    """What an honest hf generator sends for group `gid`: the prompt's ids as the engine
    encodes them, texts decoded from the completion ids as the engine decodes them."""
    tok = check.tokenizer
    prompt_ids = tok(check.task.problem(gid).prompt)["input_ids"]
    rows = [tok("12")["input_ids"][-2:], tok(" 7")["input_ids"][-1:]]
    ids = [t for r in rows for t in r]
    return m.Rollout(
        lease_id=1, group_id=gid, instance="gen-0", policy_version=0,
        prompt_ids=np.array(prompt_ids, np.int32), completion_ids=np.array(ids, np.int32),
        completion_offsets=np.array([0, len(rows[0]), len(ids)], np.int64),
        logprobs=np.zeros(len(ids), np.float32),
        texts=[tok.decode(r, skip_special_tokens=True) for r in rows], truncated=[False, False],
        gen_seconds=0.1, sampling=sampling_params(cfg.generator),
    )  # fmt: skip


def test_an_honest_rollout_passes(check: ContentCheck, cfg: RunConfig) -> None:
    assert check.check(honest(check, cfg), "gen-0") is None


def test_texts_that_are_not_the_ids_decoding_are_refused(
    check: ContentCheck, cfg: RunConfig
) -> None:
    ro = honest(check, cfg)
    ro.texts = [ro.texts[0], "the right answer"]
    assert "text 1 is not the decoding" in str(check.check(ro, "gen-0"))


def test_a_token_id_outside_the_vocabulary_is_refused(check: ContentCheck, cfg: RunConfig) -> None:
    ro = honest(check, cfg)
    ro.completion_ids = np.array([*ro.completion_ids[:-1], 10**6], np.int32)
    why = str(check.check(ro, "gen-0"))
    assert f"token id {10**6}" in why and f"[0, {check.vocab})" in why
    ro = honest(check, cfg)
    ro.prompt_ids = np.array([-1, *ro.prompt_ids], np.int32)
    assert "token id -1" in str(check.check(ro, "gen-0"))


def test_the_ids_of_another_prompt_are_refused(check: ContentCheck, cfg: RunConfig) -> None:
    ro = honest(check, cfg, gid=3)
    ro.prompt_ids = honest(check, cfg, gid=4).prompt_ids
    assert check.task.problem(3).prompt != check.task.problem(4).prompt
    assert "not the tokens of the prompt leased" in str(check.check(ro, "gen-0"))


def test_another_instance_or_sampling_is_refused(check: ContentCheck, cfg: RunConfig) -> None:
    assert "says it is from 'gen-0'" in str(check.check(honest(check, cfg), "gen-1"))
    ro = honest(check, cfg)
    ro.sampling = m.SamplingParams(temperature=0.1, top_p=1.0, max_tokens=4)
    assert "leased with" in str(check.check(ro, "gen-0"))


def test_the_vocabulary_is_the_models_embedding_rows(check: ContentCheck, tmp_path: Path) -> None:
    from grpo_stream.models.loading import load_policy

    model = load_policy("grpo-stream/tiny-arith", dtype="float32", trainable=False)
    assert check.vocab == model.get_input_embeddings().num_embeddings
