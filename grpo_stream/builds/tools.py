"""Build the tiny model that calls tools: `python -m grpo_stream.builds.tools`.

tiny-arith's character-level tokenizer and Qwen2 shape (`grpo_stream.builds.tiny`),
256 positions, and a chat template (`CHAT_TEMPLATE`) that renders the tools it is offered and
its function calls the Hermes way the one parser reads (`grpo_stream.agents.toolcalls`):

    <bos>tool calc(expr)
    Q:37*48=
    A:<tool_call>{"name": "calc", "arguments": {"expr": "37*48"}}</tool_call><eos>
    R:1776
    A:1776<eos>

A short supervised warm start on whole calc episodes (`grpo_stream.agents.calc`), built
turn by turn exactly as the generator's endpoint builds them (`grpo_stream.agents.chat`):
half call the tool with the problem's expression and copy its answer, half answer at once.
Answering at once is hard for a model this small; calling is copying a fixed JSON frame and
the expression. SFT stops as soon as the expected success at temperature 1.0 (the
probability of sampling one of the two demonstrated episodes, one teacher-forced forward
pass) reaches `--target`, so GRPO starts from a policy that writes a well-formed call some
of the time and has a clear way to improve.

Invariants: deterministic for a given seed and torch version (one thread); weights saved in
bfloat16; the success, tool-call and malformed-call rates in build_info.json are measured on
the weights as saved and reloaded, through the hf engine's turn loop against
`CalcToolsEnv` (the same parser and rules as the agent).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import torch

from grpo_stream.agents.calc import CALC_TOOL, CalcToolsEnv, run_tool
from grpo_stream.agents.chat import ChatFormat, Conversation, assistant_message
from grpo_stream.agents.toolcalls import ToolCall, format_reply, parse_reply
from grpo_stream.builds import sft
from grpo_stream.builds.calc import calc_task
from grpo_stream.builds.sft import Batch, Built, WarmStart, build_main, finish, pad_rows
from grpo_stream.builds.tiny import build_model, build_tokenizer
from grpo_stream.config.envs import EnvSettings
from grpo_stream.engines.hf import HFEngine
from grpo_stream.envs.episodes import EpisodeRun, run_episodes
from grpo_stream.envs.local import LocalEnvs
from grpo_stream.envs.turns import TurnFormat
from grpo_stream.sampling import Sampling
from grpo_stream.tasks.arith import ArithTask

MAX_POSITIONS = 256
TURNS = 3
MAX_EPISODE_TOKENS = 128
TURN_TOKENS = 80
TOOL_SHARE = 0.5
"""Share of the demonstrations that call the tool (the others answer at once)."""
LR = 1e-3
"""AdamW's learning rate (2e-3 stalled at loss 0.22 for 300 steps: no copying learned)."""
EVAL_PROBLEMS = 64
BUILD_THREADS = 1
"""One torch thread (the weights depend on it; see build_calc.BUILD_THREADS)."""

CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for t in tools or [] -%}"
    "{{- 'tool ' ~ t.function.name ~ '(' ~ (t.function.parameters.properties | list | join(','))"
    " ~ ')\\n' -}}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}{{- m.content ~ '\\n' -}}"
    "{%- elif m.role == 'user' -%}{{- 'Q:' ~ m.content ~ '\\n' -}}"
    "{%- elif m.role == 'assistant' -%}{{- 'A:' ~ (m.content or '') -}}"
    "{%- for c in m.tool_calls or [] -%}"
    "{{- '<tool_call>' ~ ({'name': c.function.name, 'arguments': c.function.arguments} | tojson)"
    " ~ '</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- eos_token ~ '\\n' -}}"
    "{%- elif m.role == 'tool' -%}{{- 'R:' ~ m.content ~ '\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'A:' -}}{%- endif -%}"
)
"""The tiny-tools chat template: tools as `tool NAME(ARGS)` lines, turns as `Q:` / `A:` /
`R:` lines, calls as the Hermes `<tool_call>` JSON (tojson, as `toolcalls.format_call`)."""


def build_tools_tokenizer() -> Any:
    """tiny-arith's character-level tokenizer with the tool-calling chat template."""
    tokenizer = build_tokenizer()
    tokenizer.model_max_length = MAX_POSITIONS
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def demo_episode(
    fmt: ChatFormat, prompt: str, answer: int, use_tool: bool
) -> tuple[list[int], list[int]]:
    """Token ids and labels (-100 off the policy's tokens) of one demonstrated episode, built
    as the endpoint builds trajectories: prompt, sampled turns, template turns between."""
    tok = fmt.tokenizer
    conv = Conversation(tools=[CALC_TOOL], rendered=[{"role": "user", "content": prompt}])
    ids = fmt.prompt(conv.rendered, conv.tools)
    labels = [-100] * len(ids)
    if use_tool:
        call = ToolCall("calc", {"expr": prompt.removesuffix("=")})
        move = [*fmt.ids(format_reply(None, [call])), tok.eos_token_id]
        conv.rendered.append(assistant_message(None, [call], ["call_0"]))
        conv.last_end = tok.eos_token
        result = {"role": "tool", "tool_call_id": "call_0", "content": run_tool(call)}
        between = fmt.turn(conv, [result])
        conv.rendered.append(result)
        ids += [*move, *between]
        labels += [*move, *([-100] * len(between))]
    move = [*fmt.ids(str(answer)), tok.eos_token_id]
    return ids + move, labels + move


def sft_batch(fmt: ChatFormat, task: ArithTask, rng: random.Random, size: int = 32) -> Batch:
    """`size` demonstrations of random training problems (indices past the eval set's)."""
    rows = []
    for _ in range(size):
        p = task.problem(rng.randrange(EVAL_PROBLEMS, 10**9))
        answer, tool = int(p.reference["answer"]), rng.random() < TOOL_SHARE
        rows.append(demo_episode(fmt, p.prompt, answer, tool))
    return pad_rows(rows, fmt.tokenizer.pad_token_id)


@torch.no_grad()
def expected_success(model: Any, fmt: ChatFormat, seed: int) -> float:
    """Mean over the first EVAL_PROBLEMS problems of P(tool episode) + P(direct answer) at
    temperature 1.0 (disjoint: their first sampled tokens differ)."""
    problems = [calc_task(seed).problem(i) for i in range(EVAL_PROBLEMS)]
    was_training = model.training
    model.eval()
    total = torch.zeros(EVAL_PROBLEMS)
    for use_tool in (True, False):
        rows = [demo_episode(fmt, p.prompt, int(p.reference["answer"]), use_tool)
                for p in problems]  # fmt: skip
        ids, mask, labels = pad_rows(rows, fmt.tokenizer.pad_token_id)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()  # (B, T-1, V)
        target = labels[:, 1:]  # (B, T-1)
        logp = torch.log_softmax(logits, -1).gather(-1, target.clamp(min=0).unsqueeze(-1))[..., 0]
        total += ((logp * (target != -100)).sum(-1)).exp()  # (B,)
    model.train(was_training)
    return float(total.mean())


def env_prompt(fmt: ChatFormat, prompt: str) -> str:
    """The first turn as text for the plain turn loop (which adds <bos> itself)."""
    text = fmt.render([{"role": "user", "content": prompt}], [CALC_TOOL], generation=True)
    return text.removeprefix(fmt.tokenizer.bos_token)


def success_rate(model: Any, tokenizer: Any, seed: int, samples: int = 4) -> dict[str, float]:
    """Success, tool-call and malformed-call rates of sampled episodes at temperature 1.0
    on the first EVAL_PROBLEMS problems, each `samples` times, through the hf turn loop
    against CalcToolsEnv."""
    fmt = ChatFormat(tokenizer)
    settings = EnvSettings(name="calc", max_turns=TURNS, max_episode_tokens=MAX_EPISODE_TOKENS)
    problems = [calc_task(seed).problem(i) for i in range(EVAL_PROBLEMS)]
    run = EpisodeRun(
        prompts=[env_prompt(fmt, p.prompt) for p in problems],
        references=[p.reference for p in problems],
        group_size=samples,
        sampling=Sampling(TURN_TOKENS, temperature=1.0, seed=seed),
    )
    was_training = model.training
    turns = TurnFormat(tokenizer, chat=True, role="tool")
    groups = run_episodes(HFEngine(model, tokenizer), tokenizer,
                          LocalEnvs(lambda: CalcToolsEnv(TURNS)), turns, settings, run)  # fmt: skip
    model.train(was_training)
    episodes = [e for g in groups for e in g]
    replies = [parse_reply(t) for e in episodes for t in e.texts]
    return {
        "success_rate": sum(e.reward for e in episodes) / len(episodes),
        "tool_call_rate": sum(bool(r.calls) for r in replies) / len(replies),
        "malformed_rate": sum(r.malformed is not None for r in replies) / len(replies),
    }


def build(out: Path, seed: int = 0, target: float = 0.20, max_steps: int = 3000) -> dict[str, Any]:
    """Build, warm-start and save tiny-tools to `out`; returns the build info and time."""
    start = time.perf_counter()
    torch.set_num_threads(BUILD_THREADS)
    tokenizer = build_tools_tokenizer()
    fmt = ChatFormat(tokenizer)
    model = build_model(tokenizer, seed, positions=MAX_POSITIONS)
    task = calc_task(seed)
    plan = WarmStart(
        batches=lambda rng: sft_batch(fmt, task, rng),
        score=lambda m: expected_success(m, fmt, seed),
        target=target, max_steps=max_steps, eval_every=20, label="success", lr=LR,
    )  # fmt: skip
    steps, expected = sft.warm_start(model, plan, seed)

    def measure(saved: Any, reloaded: Any) -> dict[str, Any]:
        rates = success_rate(saved, reloaded, seed, samples=8)
        return {**{k: round(v, 4) for k, v in rates.items()}, "episodes": EVAL_PROBLEMS * 8}

    fields = Built(seed, steps, target).fields(
        tool_share=TOOL_SHARE, expected_success_at_stop=round(expected, 4)
    )
    return finish(model, tokenizer, out, fields, measure, start)


def main(argv: list[str] | None = None) -> None:
    build_main(__doc__, build, "grpo_stream/assets/tiny-tools", 0.20, 3000, argv)


if __name__ == "__main__":
    main()
