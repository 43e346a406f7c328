"""The endpoint with real agents in the real sandbox, over HTTP with the openai client; the
engine is scripted (tests/unit/agents/scripted.py) so each test says what the model writes.
Trajectories, tool calls, malformed calls, budgets, refusals, failing agents."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from grpo_stream.agents.calc import CALC_TOOL
from grpo_stream.agents.chat import ChatFormat
from grpo_stream.agents.player import AgentPlayer
from grpo_stream.builds.tools import build_tools_tokenizer
from grpo_stream.config.envs import EnvSettings
from grpo_stream.envs.episodes import Episode, EpisodeRun
from grpo_stream.envs.sandbox import EnvPoolError
from grpo_stream.sampling import Sampling

from .conftest import HERE
from .scripted import Scripted

CALL = '<tool_call>{"name": "calc", "arguments": {"expr": "3+4"}}</tool_call><eos>'
BASE = EnvSettings(agent="agents_for_tests:dispatch", agent_timeout_s=20.0, max_turns=3,
                   max_episode_tokens=128, memory_limit_mb=256, batch_wait_s=0.01)  # fmt: skip


@pytest.fixture(scope="module")
def player() -> Iterator[AgentPlayer]:
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(HERE))  # the agent workers import agents_for_tests
    tok = build_tools_tokenizer()
    try:
        with AgentPlayer(BASE, Scripted(tok, lambda text: "7<eos>"), tok, "tiny") as p:
            yield p
    finally:
        mp.undo()


def play(
    player: AgentPlayer, script: Callable[[str], str], *dos: str, group: int = 1, **env: Any
) -> list[Episode]:
    player.engine.script = script  # type: ignore[attr-defined]
    player.settings = player.pool.settings = BASE.model_copy(update=env)
    run = EpisodeRun(
        prompts=[f"p{i}" for i in range(len(dos))],
        references=[{"do": do, "answer": 7} for do in dos], group_size=group,
        sampling=Sampling(96, seed=0),
    )  # fmt: skip
    return [e for g in player.play_run(run) for e in g]


def call_once(text: str) -> str:
    return CALL if "R:" not in text else "7<eos>"


def forced_or_hi(text: str) -> str:
    """The rest of a call after a forced named prefix, else a plain reply."""
    return '{"expr": "3+4"}}</tool_call><eos>' if text.endswith('"arguments": ') else "hi<eos>"


def slowly(script: Callable[[str], str]) -> Callable[[str], str]:
    """A model that takes a while (a request sent meanwhile finds its episode busy)."""

    def run(text: str) -> str:
        time.sleep(0.5)
        return script(text)

    return run


def ids(tok: Any, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def test_a_call_comes_back_as_tool_calls_and_the_trajectory_is_exact(player: AgentPlayer) -> None:
    before = player.stats()["tool_calls"]
    eps = play(player, call_once, "calls_then_answers", group=2)
    tok = player.tokenizer
    prompt = ChatFormat(tok).prompt([{"role": "user", "content": "3+4="}], [CALC_TOOL])
    call, between, answer = ids(tok, CALL), ids(tok, "\nR:3+4\nA:"), ids(tok, "7<eos>")
    for ep in eps:
        assert ep.error is None and ep.reward == 1.0 and not ep.truncated  # answered on turn 1
        assert ep.prompt_ids == prompt
        assert ep.token_ids == call + between + answer
        assert ep.mask == [1] * len(call) + [0] * len(between) + [1] * len(answer)
        assert ep.turn_starts == [0, len(call) + len(between)]
        sampled = [lp for lp, m in zip(ep.logprobs, ep.mask, strict=True) if m]
        assert sampled == [-0.01 * (i + 1) for i in range(len(call))] + [-0.01, -0.02]
        assert all(lp == 0.0 for lp, m in zip(ep.logprobs, ep.mask, strict=True) if not m)
    assert player.stats()["tool_calls"] - before == 2


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ('<tool_call>{"name": "calc", "arguments": {</tool_call><eos>', "not valid JSON"),
        ('<tool_call>{"name": "search", "arguments": {}}</tool_call><eos>', "no tool named"),
    ],
)
def test_a_malformed_call_is_answered_with_a_tool_error_and_sampled_again(
    player: AgentPlayer, bad: str, why: str
) -> None:
    before = player.stats()["tool_calls_malformed"]
    (ep,) = play(
        player,
        lambda t: bad if "R:" not in t else "7<eos>",
        "calls_then_answers",
        max_episode_tokens=256,
    )
    tok = player.tokenizer
    assert ep.error is None and ep.reward == 0.0  # the agent's first reply had no call
    first = ids(tok, bad)
    error_turn = tok.decode(ep.token_ids[len(first) : ep.turn_starts[1]])
    assert error_turn.startswith("\nR:error: ") and why in error_turn and error_turn.endswith("A:")
    assert ep.mask[: len(first)] == [1] * len(first)
    assert ep.texts[1] == "7" and len(ep.turn_starts) == 2
    assert player.stats()["tool_calls_malformed"] - before == 1


def test_requests_past_env_max_turns_get_an_empty_length_reply(player: AgentPlayer) -> None:
    (ep,) = play(player, lambda t: "hi<eos>", "until_length", max_turns=3)
    assert ep.error is None and ep.reward == 3.0  # three replies, then "length"
    assert ep.truncated and len(ep.turn_starts) == 3


def test_a_reply_cut_at_the_token_budget_truncates(player: AgentPlayer) -> None:
    (ep,) = play(player, lambda t: "x" * 200 + "<eos>", "until_length", max_episode_tokens=40)
    assert ep.truncated and ep.error is None and len(ep.token_ids) == 40
    assert ep.reward == 1.0  # its one reply came back cut; the next request found no room


@pytest.mark.parametrize(
    ("do", "why"),
    [
        ("edits_history", "differs from what this episode holds"),
        ("raises", "agent raised ValueError: the agent broke"),
        ("returns_text", "agent returned str, not a number"),
        ("never_asks", "the agent returned without a model turn"),
        ("hogs", "memory limit"),
    ],
)
def test_a_failing_agent_fails_its_episode_with_the_reason(
    player: AgentPlayer, do: str, why: str
) -> None:
    before = player.stats()["episodes_failed"]
    (ep,) = play(player, lambda t: "7<eos>", do)
    assert math.isnan(ep.reward) and why in (ep.error or "")
    assert player.stats()["episodes_failed"] - before == 1


def test_a_hanging_agent_times_out_and_the_others_finish(player: AgentPlayer) -> None:
    hung, fine = play(player, call_once, "hangs", "calls_then_answers", agent_timeout_s=5.0)
    assert "exceeded env.agent_timeout_s=5.0" in (hung.error or "")
    assert fine.error is None and fine.reward == 1.0


def test_an_agent_spinning_on_the_cpu_costs_its_worker_then_the_next_batch_runs(
    player: AgentPlayer,
) -> None:
    spun, neighbour = play(player, lambda t: "7<eos>", "spins", "hangs", agent_timeout_s=1.0)
    assert "exceeded env.agent_timeout_s" in (spun.error or "")
    assert "did not stop" in (neighbour.error or "") or "exceeded" in (neighbour.error or "")
    (after,) = play(player, call_once, "calls_then_answers")
    assert after.error is None and after.reward == 1.0


def test_the_cpu_limit_stops_a_worker_that_burns_it(player: AgentPlayer) -> None:
    (ep,) = play(player, lambda t: "7<eos>", "spins", agent_timeout_s=60.0, agent_cpu_s=1.0)
    assert "exceeded env.agent_cpu_s=1.0" in (ep.error or "")


CLIENT_CASES = ["twice_at_once", "retries_a_lost_reply", "refused_fields",
                "choice_none_and_forced", "raw_http", "token_ids_in_and_out"]  # fmt: skip


@pytest.mark.parametrize("do", CLIENT_CASES)
def test_the_endpoint_answers_as_openai_clients_expect(player: AgentPlayer, do: str) -> None:
    before = player.stats()["sampling_overridden"]
    (ep,) = play(player, slowly(forced_or_hi) if do == "twice_at_once" else forced_or_hi, do)
    assert ep.error is None, ep.error
    if do == "refused_fields":
        assert player.stats()["sampling_overridden"] - before == 1


def test_a_tool_choice_forced_call_keeps_its_prefix_off_the_loss(player: AgentPlayer) -> None:
    (ep,) = play(player, forced_or_hi, "choice_none_and_forced")
    tok = player.tokenizer
    forced = ids(tok, '<tool_call>{"name": "calc", "arguments": ')
    start = ep.turn_starts[1]
    assert ep.token_ids[start - len(forced) : start] == forced
    assert ep.mask[start - len(forced) : start] == [0] * len(forced)


def test_an_unknown_episode_is_a_404(player: AgentPlayer) -> None:
    got = httpx.post(player.server.url("no-such-secret") + "/chat/completions", json={})
    assert got.status_code == 404 and "no such episode" in got.json()["error"]["message"]


@pytest.mark.parametrize(
    ("agent", "why"),
    [("agents_for_tests:nope", "does not load"), ("agents_for_tests:expect", "not an async")],
)
def test_an_agent_that_does_not_load_is_one_line_naming_env_agent(agent: str, why: str) -> None:
    tok = build_tools_tokenizer()
    player = AgentPlayer(BASE.model_copy(update={"agent": agent}), Scripted(tok, str), tok, "t")
    with pytest.raises(EnvPoolError, match=rf"env\.agent = '{agent}'.*{why}"), player:
        pass


def test_a_generator_asked_to_stop_cancels_its_agents(player: AgentPlayer) -> None:
    player.stopping = lambda: True
    try:
        (ep,) = play(player, lambda t: "7<eos>", "hangs")
    finally:
        player.stopping = lambda: False
    assert ep.error == "the generator is stopping"


def test_evaluation_plays_the_agent_through_the_same_endpoint(player: AgentPlayer) -> None:
    from grpo_stream.config.evaluator import EvalSettings
    from grpo_stream.evaluator.agents import evaluate_agent
    from grpo_stream.tasks.base import Problem

    player.engine.script = call_once  # type: ignore[attr-defined]
    player.settings = player.pool.settings = BASE
    problems = [Problem(0, "p0", {"do": "calls_then_answers"}), Problem(1, "p1", {"do": "raises"})]
    row = evaluate_agent(player, problems, EvalSettings(k=2), Sampling(96, seed=0))
    assert row["eval/pass@1"] == 0.5 and row["eval/pass@k"] == 0.5  # one problem solved
    assert row["eval/reward"] == 1.0 and row["eval/episodes_failed"] == 2
    assert row["eval/tool_calls"] == 4 and row["eval/tool_calls_malformed"] == 0  # 1 each
