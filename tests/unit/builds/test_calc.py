"""The tiny-calc build's demonstrations: the tool route and the direct route, trained on the
policy's tokens only, with the observation the calc environment really gives."""

from __future__ import annotations

import random

from grpo_stream.builds.calc import TOOL_SHARE, calc_task, demo_episode, sft_batch
from grpo_stream.builds.tiny import build_tokenizer


def test_the_tool_demo_calls_copies_the_tools_answer_and_trains_only_the_policy() -> None:
    tok = build_tokenizer()
    ids, labels = demo_episode(tok, "37*48=", 1776, use_tool=True)
    assert tok.decode(ids) == "<bos>37*48=<calc>37*48</calc><eos>[1776]1776<eos>"
    trained = [i for i, lab in zip(ids, labels, strict=True) if lab != -100]
    assert tok.decode(trained) == "<calc>37*48</calc><eos>1776<eos>"


def test_the_direct_demo_answers_at_once() -> None:
    tok = build_tokenizer()
    ids, labels = demo_episode(tok, "12-57=", -45, use_tool=False)
    assert tok.decode(ids) == "<bos>12-57=-45<eos>"
    n_prompt = len(tok("12-57=")["input_ids"])
    assert labels == [-100] * n_prompt + ids[n_prompt:]


def test_batches_mix_both_routes_and_avoid_the_evaluation_problems() -> None:
    tok = build_tokenizer()
    task = calc_task(0)
    held = {task.problem(i).prompt for i in range(64)}
    ids, _, _ = sft_batch(tok, task, random.Random(0), size=64)
    texts = [tok.decode(row[row != tok.pad_token_id].tolist()) for row in ids]
    tool = sum("<calc>" in t for t in texts) / len(texts)
    assert abs(tool - TOOL_SHARE) < 0.2
    prompts = {t.removeprefix("<bos>").split("=")[0] + "=" for t in texts}
    assert len(prompts & held) < 3  # drawn from indices past the evaluation set
