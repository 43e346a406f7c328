"""The generator's main thread at the endpoint: requests of many agents sampled as batches.

Each waiting request is admitted (its text tokenized and appended to its episode's
trajectory, budgets checked), the admitted rows are sampled in one engine call, and each
reply is applied to its episode and answered. The engine is the in-process turn loop's:
the hf turn cache (KV kept between turns) when the call holds every episode that still
talks to the model, a stateless `complete` otherwise (an agent still busy with a tool
must not have its cache row dropped).

Invariants (the turn loop's, `grpo_stream.envs.episodes`):
- an episode's `token_ids` are, in order, template or prompt tokens (mask 0, log-prob 0.0)
  and the ids the policy sampled (mask 1, their behaviour log-probs), never re-tokenized;
- `len(token_ids) <= env.max_episode_tokens` and at most env.max_turns policy turns: a
  request past either is answered with an empty reply, finish_reason "length", and the
  episode is truncated; a reply cut at the budget truncates it too;
- a malformed call (`toolcalls.parse_reply`, or a tool not offered) is counted and, while
  the budgets allow, answered with a tool error message the model sees in its next turn,
  which is sampled within the same request; the agent gets the first well-formed reply.
"""

from __future__ import annotations

import time
from typing import Any

from grpo_stream.agents.chat import ChatFormat, assistant_message
from grpo_stream.agents.episode import AgentEpisode, Reply, TurnRequest
from grpo_stream.agents.openai_api import (
    FinishReason,
    chat_response,
    completion_response,
    token_logprobs,
)
from grpo_stream.agents.toolcalls import ToolCall, parse_reply, unknown_tool
from grpo_stream.config.envs import EnvSettings
from grpo_stream.envs.episodes import TurnEngine, open_session
from grpo_stream.sampling import Completion, Sampling


class Batcher:
    """Admits, samples and answers the endpoint's requests (main thread only)."""

    def __init__(
        self,
        engine: TurnEngine,
        tokenizer: Any,
        fmt: ChatFormat | None,
        settings: EnvSettings,
        sampling: Sampling,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.fmt = fmt
        self.settings = settings
        self.sampling = sampling  # the run's; call k is seeded by its `child(k)`
        self.session = open_session(engine)
        self.pending: list[TurnRequest] = []
        self.last_arrival = 0.0
        self.calls = 0
        self.turns = 0

    def close(self) -> None:
        self.session.close()

    def add(self, requests: list[TurnRequest]) -> None:
        if requests:
            self.pending += requests
            self.last_arrival = time.monotonic()

    def ready(self, talking: set[int], now: float) -> bool:
        """Sample now: every episode still talking to the model waits for it, or no request
        came for env.batch_wait_s."""
        if not self.pending:
            return False
        waiting = {r.ep.key for r in self.pending}
        return waiting >= talking or now - self.last_arrival >= self.settings.batch_wait_s

    def due(self) -> float | None:
        """When the waiting requests are sampled at the latest (None: none waits)."""
        return self.last_arrival + self.settings.batch_wait_s if self.pending else None

    def drop(self, ep: AgentEpisode | None, why: str) -> None:
        """Answer the waiting requests of a stopped episode (of every one: None) with an
        error."""
        for req in [r for r in self.pending if ep is None or r.ep is ep]:
            self.pending.remove(req)
            _answer(req, (410, {"error": {"message": why, "type": "episode_over", "code": 410}}))

    # ---- one batch ------------------------------------------------------------------

    def step(self, talking: set[int]) -> None:
        """Admit every waiting request, sample the admitted ones in one call, answer."""
        batch, self.pending = self.pending, []
        tokenized = self._tokenize(batch)
        rows: list[tuple[TurnRequest, int]] = []
        for req, ids in zip(batch, tokenized, strict=True):
            req.ep.overridden += req.overridden
            req.overridden = False  # a retry of it is not counted again
            limit = self._admit(req, ids)
            if limit is not None:
                rows.append((req, limit))
        if not rows:
            return
        keys = [r.ep.key for r, _ in rows]
        ids_rows = [r.ep.traj.prompt_ids + r.ep.traj.token_ids for r, _ in rows]
        sampling = self.sampling.child(self.calls, max_tokens=max(limit for _, limit in rows))
        self.calls += 1
        if set(keys) == talking - {r.ep.key for r in batch if r.ep.over}:
            got = self.session.complete(keys, ids_rows, sampling)
        else:  # an agent still busy elsewhere: keep its cache row for its next turn
            got = self.engine.complete(ids_rows, sampling)
        for (req, limit), completion in zip(rows, got, strict=True):
            self._finish(req, completion, limit)

    def _tokenize(self, batch: list[TurnRequest]) -> list[list[int]]:
        """Each request's ids: given, or its text tokenized (one call per kind of text)."""
        out: list[list[int]] = [r.ids or [] for r in batch]
        for special in (False, True):
            todo = [i for i, r in enumerate(batch) if r.ids is None and r.special == special]
            for i, ids in zip(
                todo, self._ids([batch[i].text or "" for i in todo], special), strict=True
            ):
                out[i] = ids
        return out

    def _ids(self, texts: list[str], special: bool) -> list[list[int]]:
        if not texts:
            return []
        out: list[list[int]] = self.tokenizer(texts, add_special_tokens=special)["input_ids"]
        return out

    def _admit(self, req: TurnRequest, ids: list[int]) -> int | None:
        """Append the request's tokens; the row's token limit, or None when answered now."""
        ep, traj, cfg = req.ep, req.ep.traj, self.settings
        if ep.over is not None:
            return self._end(req, ep.over)
        if ep.kind is None:
            if not ids:
                _answer(
                    req,
                    (
                        400,
                        {
                            "error": {
                                "message": "the prompt encodes to no tokens",
                                "type": "invalid_request_error",
                                "code": 400,
                            }
                        },
                    ),
                )
                return None
            traj.prompt_ids, ep.kind, ep.conv.tools = list(ids), req.kind, req.tools
        elif len(traj.turn_starts) >= cfg.max_turns:
            return self._end(req, "env.max_turns")
        elif len(traj.token_ids) + len(ids) >= cfg.max_episode_tokens:
            return self._end(req, "env.max_episode_tokens")
        else:
            traj.add_env_turn(ids)
        for msg in req.new:
            ep.conv.visible.append(len(ep.conv.rendered))
            ep.conv.rendered.append(msg)
        ep.conv.head = req.head
        if req.kind == "text":
            ep.text_so_far += req.text or ""
        if req.forced:
            forced = self._ids([req.forced], False)[0]
            if len(traj.token_ids) + len(forced) >= cfg.max_episode_tokens:
                return self._end(req, "env.max_episode_tokens")
            traj.add_env_turn(forced)
        room = cfg.max_episode_tokens - len(traj.token_ids)
        return min(x for x in (req.limit, self.sampling.max_tokens, room) if x is not None)

    def _end(self, req: TurnRequest, why: str) -> int | None:
        """The episode's budget is spent: an empty reply, finish_reason length (None: the
        request needs no sampling)."""
        req.ep.over, req.ep.traj.truncated = why, True
        _answer(req, self._reply(req, "", [], "length", [], []))
        return None

    def _finish(self, req: TurnRequest, c: Completion, limit: int) -> None:
        ep, traj = req.ep, req.ep.traj
        self.turns += 1
        whole = traj.add_policy_turn(c, limit)
        kept, lps = c.token_ids[:limit], c.logprobs[:limit]
        ended = whole and not c.truncated and bool(kept)
        text = c.text if whole else self.tokenizer.decode(kept, skip_special_tokens=True)
        traj.texts[-1] = text
        ep.conv.last_end = self.tokenizer.decode(kept[-1:]) if ended else None
        if not ended and len(traj.token_ids) >= self.settings.max_episode_tokens:
            ep.over, traj.truncated = "env.max_episode_tokens", True
        finish: FinishReason = "stop" if ended else "length"
        content, calls = (req.forced or "") + text, []
        if req.parse and ended:
            parsed = parse_reply(content)
            bad = parsed.malformed or unknown_tool(parsed.calls, req.tool_names)
            if bad is not None:
                ep.malformed += 1
                if self._retry(req, content, bad):
                    return
                finish = "length"  # no budget left to answer the call: the episode ends
                ep.over, traj.truncated = "env.max_turns", True
            else:
                content, calls = parsed.content or "", parsed.calls
                finish = "tool_calls" if calls else "stop"
                ep.calls += len(calls)
        _answer(req, self._reply(req, content, calls, finish, kept, lps))

    def _retry(self, req: TurnRequest, raw: str, why: str) -> bool:
        """Answer a malformed call with a tool error the model sees, and sample again within
        the same request (False when the budgets leave no room for it)."""
        ep = req.ep
        if self.fmt is None or len(ep.traj.turn_starts) >= self.settings.max_turns:
            return False
        ep.conv.rendered.append({"role": "assistant", "content": raw})  # the agent never sees it
        error = {"role": "tool", "tool_call_id": "", "content": f"error: {why}"}
        req.text, req.head = self.fmt.next_turn(ep.conv, [error])
        req.ids, req.special, req.new = None, False, []
        ep.conv.rendered.append(error)
        self.pending.append(req)
        self.last_arrival = time.monotonic()
        return True

    def _reply(
        self,
        req: TurnRequest,
        content: str,
        calls: list[ToolCall],
        finish: FinishReason,
        kept: list[int],
        lps: list[float],
    ) -> Reply:
        ep = req.ep
        turn = len(ep.traj.turn_starts)
        rid = f"grpo-{ep.key}-{turn}"
        logprobs = None
        if req.logprobs:
            logprobs = token_logprobs([self.tokenizer.decode([t]) for t in kept], lps)
        seen = len(ep.traj.prompt_ids) + len(ep.traj.token_ids) - len(kept)
        usage = (seen, len(kept))  # what the model conditioned on, what it sampled
        if req.kind != "chat":
            if req.kind == "text":
                ep.text_so_far += content
            body = completion_response(rid, req.model, content, finish, usage, logprobs)
        else:
            ids = [f"call_{turn}_{j}" for j in range(len(calls))]
            if finish != "length" or kept:  # an empty "length" reply adds nothing
                ep.conv.visible.append(len(ep.conv.rendered))
                ep.conv.rendered.append(assistant_message(content, calls, ids))
            body = chat_response(
                rid=rid,
                model=req.model,
                content=content or (None if calls else ""),
                calls=calls,
                call_ids=ids,
                finish=finish,
                usage=usage,
                logprobs=logprobs,
            )
        if req.token_ids:  # vLLM's extension: the exact ids, for token-in-token-out agents
            body["prompt_token_ids"] = (ep.traj.prompt_ids + ep.traj.token_ids)[:seen]
            body["choices"][0]["token_ids"] = list(kept)
        return 200, body


def _answer(req: TurnRequest, reply: Reply) -> None:
    ep = req.ep
    ep.waited_s += time.monotonic() - req.arrived
    ep.last_digest, ep.last_reply = req.digest, reply
    req.future.set_result(reply)
