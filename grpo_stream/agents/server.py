"""The generator's OpenAI-compatible endpoint: Starlette routes served by uvicorn on a thread.

    POST {base}/chat/completions    messages, tools, tool_choice   (grpo_stream.agents.chat)
    POST {base}/completions         prompt as text or token ids
    GET  {base}/models
    base = http://HOST:PORT/e/{secret}/v1   (one secret per episode, given to its agent)

The server thread parses and validates a request, renders what the agent added with the
chat template (`grpo_stream.agents.episode`), leaves it in the `Inbox` and awaits its future;
the generator's main thread samples it with other agents' requests as one batch and answers
(`grpo_stream.agents.batcher`). The server never touches the engine or the tokenizer's
encoder (the main thread owns both). Unknown secrets are 404s; a request while another of
its episode is in flight is a 409; a request whose body repeats the episode's last one
(a client retrying a lost reply) gets that reply again, not a new turn.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

from grpo_stream.agents.chat import ChatFormat
from grpo_stream.agents.episode import (
    AgentEpisode,
    Reply,
    TurnRequest,
    digest,
    prepare_chat,
    prepare_text,
)
from grpo_stream.agents.inbox import Inbox
from grpo_stream.agents.openai_api import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    models_response,
    parse,
)

log = structlog.get_logger()

Prepare = Callable[[AgentEpisode, Any, str], TurnRequest]

START_TIMEOUT_S = 30.0


class EndpointServer:
    """uvicorn serving the endpoint's routes on a daemon thread."""

    def __init__(
        self, inbox: Inbox, fmt: ChatFormat | None, vocab: int, model: str, host: str, port: int
    ) -> None:
        self.inbox, self.fmt, self.vocab, self.model = inbox, fmt, vocab, model
        self.host = host
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.port: int = self._sock.getsockname()[1]
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def url(self, secret: str) -> str:
        """The base URL an episode's agent is given."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/e/{secret}/v1"

    def start(self) -> None:
        import uvicorn  # the server libraries load in generators that serve agents only

        config = uvicorn.Config(
            self.app(),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_keep_alive=60,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._sock]},
            daemon=True,
            name="agent-endpoint",
        )
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the agent endpoint did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        log.info("agent.endpoint_started", host=self.host, port=self.port)

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(5.0)
        self._sock.close()

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Route

        base = "/e/{secret}/v1"
        return Starlette(
            routes=[
                Route(f"{base}/chat/completions", self._chat, methods=["POST"]),
                Route(f"{base}/completions", self._completions, methods=["POST"]),
                Route(f"{base}/models", self._models, methods=["GET"]),
            ]
        )

    # ---- routes ---------------------------------------------------------------------

    async def _chat(self, request: Any) -> Any:
        def prepare(ep: AgentEpisode, body: Any, key: str) -> TurnRequest:
            req = parse(ChatRequest, body)
            turn = prepare_chat(ep, req, self.fmt, key)
            turn.overridden = bool(req.overrides(*self._sampling()))
            return turn

        return await self._serve(request, prepare)

    async def _completions(self, request: Any) -> Any:
        def prepare(ep: AgentEpisode, body: Any, key: str) -> TurnRequest:
            req = parse(CompletionRequest, body)
            turn = prepare_text(ep, req, self.vocab, key)
            turn.overridden = bool(req.overrides(*self._sampling()))
            return turn

        return await self._serve(request, prepare)

    async def _models(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        if self.inbox.episode(request.path_params["secret"]) is None:
            return JSONResponse(ApiError(404, "no such episode").body(), status_code=404)
        return JSONResponse(models_response(self.model))

    def _sampling(self) -> tuple[float, float]:
        s = self.inbox.sampling
        return s.temperature, s.top_p

    async def _serve(self, request: Any, prepare: Prepare) -> Any:
        from starlette.responses import JSONResponse

        status, body = await self._answer(request, prepare)
        return JSONResponse(body, status_code=status)

    async def _answer(self, request: Any, prepare: Prepare) -> Reply:
        ep = self.inbox.episode(request.path_params["secret"])
        if ep is None:
            return 404, ApiError(404, "no such episode (its batch may be over)").body()
        try:
            body = await request.json()
        except ValueError:
            return 400, ApiError(400, "the body is not JSON").body()
        key = digest(body)
        if key == ep.last_digest and ep.last_reply is not None:
            return ep.last_reply  # a retry of a reply the client lost
        refused = self.inbox.claim(ep)
        if refused is not None:
            return (410 if ep.done else 409), ApiError(409, refused).body()
        try:
            turn = prepare(ep, body, key)
            self.inbox.put(turn)
            return await asyncio.wrap_future(turn.future)
        except ApiError as exc:
            return exc.status, exc.body()
        except Exception as exc:  # a bug of ours: said, and the agent told, never silent
            log.exception("agent.endpoint_error", episode=ep.key)
            return 500, ApiError(500, f"{type(exc).__name__}: {exc}", "server_error").body()
        finally:
            self.inbox.release(ep)
