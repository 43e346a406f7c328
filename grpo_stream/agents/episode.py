"""One agent episode at the endpoint, and turning an HTTP request into its next turn.

`prepare_chat` and `prepare_text` run on the endpoint's server thread: they validate a
request against what the episode holds and render the template text of what the agent
added, mutating nothing. The generator's main thread then admits the `TurnRequest` into a
batch and applies the sampled reply (`grpo_stream.agents.batcher`): the trajectory, the
conversation and the counters change on that thread only.

Requests of one episode are sequential (`AgentEpisode.busy`: a second one while the first
is in flight is refused), so the server thread reads a history nothing is changing.
"""

from __future__ import annotations

import hashlib
import json
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal

from grpo_stream.agents.chat import ChatFormat, Conversation, RequestError, new_messages, normalize
from grpo_stream.agents.openai_api import ApiError, ChatRequest, CompletionRequest
from grpo_stream.agents.toolcalls import forced_prefix
from grpo_stream.envs.episodes import Episode

Kind = Literal["chat", "text", "ids"]
Reply = tuple[int, dict[str, Any]]
"""An HTTP status and its JSON body."""


@dataclass
class AgentEpisode:
    """An episode played by an agent: its trajectory and what the endpoint knows of it."""

    key: int
    secret: str
    """The part of its URL only its agent is given."""
    task: dict[str, Any]
    traj: Episode
    conv: Conversation = field(default_factory=Conversation)
    kind: Kind | None = None
    """chat, text (/v1/completions with text) or ids (with token ids), set by the first
    request: an episode is one conversation of one kind."""
    text_so_far: str = ""
    """text: the prompt as the agent knows it (its prompts and the replies returned)."""
    over: str | None = None
    """The budget that ended the episode (it is then truncated)."""
    busy: bool = False
    done: bool = False
    """The agent returned, failed or was stopped."""
    started: float = field(default_factory=time.monotonic)
    waited_s: float = 0.0
    """Time its requests spent at the endpoint (not the agent's own time)."""
    calls: int = 0
    malformed: int = 0
    overridden: int = 0
    last_digest: str | None = None
    last_reply: Reply | None = None

    def agent_seconds(self, now: float) -> float:
        """The agent's own time so far (its waits for the model excluded)."""
        return now - self.started - self.waited_s


@dataclass
class TurnRequest:
    """One request, ready for the main thread: what to append, then how to sample."""

    ep: AgentEpisode
    kind: Kind
    text: str | None
    """Template or prompt text to tokenize and append before sampling (None: `ids`)."""
    ids: list[int] | None
    special: bool
    """Tokenize `text` with the tokenizer's special tokens (a first raw prompt)."""
    limit: int | None
    digest: str
    model: str
    logprobs: bool
    future: Future[Reply]
    new: list[dict[str, Any]] = field(default_factory=list)
    head: str | None = None
    """chat: the conversation rendered up to the turn this request samples."""
    tools: list[dict[str, Any]] | None = None
    tool_names: list[str] = field(default_factory=list)
    parse: bool = False
    forced: str | None = None
    token_ids: bool = False
    """Return the ids the model saw and sampled (`return_token_ids`)."""
    overridden: bool = False
    """The request asked for other sampling than the run's (served under the run's)."""
    arrived: float = field(default_factory=time.monotonic)


def digest(body: Any) -> str:
    """A request's identity (a client retrying a lost reply sends the same body)."""
    blob = json.dumps(body, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def prepare_chat(
    ep: AgentEpisode, req: ChatRequest, fmt: ChatFormat | None, key: str
) -> TurnRequest:
    """The next turn of a chat episode (ApiError 400 when the request cannot extend it)."""
    if fmt is None:
        raise ApiError(400, "this model has no chat template: use /v1/completions")
    if ep.kind not in (None, "chat"):
        raise ApiError(400, "this episode plays /v1/completions; an episode is one kind")
    parse, name = req.choice()
    try:
        messages = [normalize(m, i) for i, m in enumerate(req.messages)]
        if ep.kind is None:
            text = head = fmt.render(messages, req.tools, generation=True)
            new = messages
        else:
            if (req.tools or None) != ep.conv.tools:
                raise RequestError("tools changed mid-episode (they are rendered in its prompt)")
            new = new_messages(ep.conv, messages)
            text, head = fmt.next_turn(ep.conv, new)
    except RequestError as exc:
        raise ApiError(400, str(exc)) from None
    except Exception as exc:  # the user's chat template (jinja) may fail on any request
        raise ApiError(
            400, f"the chat template cannot render this request: {type(exc).__name__}: {exc}"
        ) from None
    return TurnRequest(
        ep=ep,
        kind="chat",
        text=text,
        ids=None,
        special=False,
        limit=req.limit(),
        digest=key,
        model=req.model,
        logprobs=req.logprobs,
        future=Future(),
        new=new,
        head=head,
        tools=req.tools or None,
        tool_names=req.tool_names(),
        parse=parse,
        forced=None if name is None else forced_prefix(name),
        token_ids=req.return_token_ids,
    )


def prepare_text(ep: AgentEpisode, req: CompletionRequest, vocab: int, key: str) -> TurnRequest:
    """The next turn of a /v1/completions episode: its prompt must extend what it holds."""
    kind: Kind = "text" if isinstance(req.prompt, str) else "ids"
    if ep.kind not in (None, kind):
        raise ApiError(400, f"this episode plays {ep.kind} requests; an episode is one kind")
    first = ep.kind is None
    text: str | None = None
    ids: list[int] | None = None
    if isinstance(req.prompt, str):
        if not req.prompt.startswith(ep.text_so_far):
            raise ApiError(
                400,
                "the prompt does not extend this episode's text so far "
                "(its earlier prompts and the replies returned)",
            )
        text = req.prompt[len(ep.text_so_far) :]
        if first and not text:
            raise ApiError(400, "prompt is empty")
    else:
        held = ep.traj.prompt_ids + ep.traj.token_ids
        if req.prompt[: len(held)] != held:
            raise ApiError(400, "the prompt ids do not extend this episode's ids so far")
        ids = req.prompt[len(held) :]
        if first and not ids:
            raise ApiError(400, "prompt is empty")
        if any(not 0 <= t < vocab for t in ids):
            raise ApiError(400, f"prompt ids must be in 0..{vocab - 1}")
    return TurnRequest(
        ep=ep,
        kind=kind,
        text=text,
        ids=ids,
        special=first,
        limit=req.max_tokens,
        digest=key,
        model=req.model,
        logprobs=req.logprobs is not None,
        future=Future(),
        token_ids=req.return_token_ids,
    )
