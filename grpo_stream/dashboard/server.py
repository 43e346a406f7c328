"""The dashboard's web server: the page, its assets, the state as JSON and the event stream.

Routes (all GET; the dashboard changes nothing):
- `/`: the page; `/static/...`: its script and style; `/vendor/plotly.min.js`: plotly.js,
  served from the installed `plotly` package (nothing is fetched from the internet);
- `/api/state`: the whole state after a fresh poll (JSON);
- `/api/events`: server-sent events, a `snapshot` then an `update` per poll.

Access: every request needs the dashboard's token, on loopback too (another user of this
machine is a stranger, as at the hub, whose status needs its status token): `?token=T` (the
page then keeps it in a same-site cookie), the cookie, or `Authorization: Bearer T`. On a
loopback address requests naming another Host are refused as well (a web page elsewhere
cannot read it through DNS rebinding). The hub's status is asked the way `grpo-stream status`
asks it (`grpo_stream.session.status`), with the run's own security settings.
"""

from __future__ import annotations

import errno
import hmac
import ipaddress
import socket
from importlib import resources
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.responses import StreamingResponse as Streaming
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from grpo_stream.dashboard import INSTALL
from grpo_stream.dashboard.feed import Feed, finite

COOKIE = "grpo_stream_dashboard"
STATIC = Path(str(resources.files("grpo_stream.dashboard") / "static"))
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "::1", "[::1]"]
MIN_TOKEN_CHARS = 16


def is_loopback(host: str) -> bool:
    """Whether a bind host is on this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def plotly_js() -> Path | None:
    """plotly.js as the `plotly` package ships it, or None when it is not installed."""
    try:
        path = Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))
    except ModuleNotFoundError:
        return None
    return path if path.is_file() else None


class TokenGate:
    """ASGI middleware: every request must carry `token` (query, cookie or bearer header)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._allowed(Request(scope)):
            await self.app(scope, receive, send)
            return
        refusal = PlainTextResponse(
            "this dashboard needs its token: open the address it printed (ending in "
            "?token=...), or read RUN_DIR/dashboard.token\n",
            status_code=401,
        )
        await refusal(scope, receive, send)

    def _allowed(self, request: Request) -> bool:
        header = request.headers.get("authorization", "")
        offered = [
            request.query_params.get("token", ""),
            request.cookies.get(COOKIE, ""),
            header.removeprefix("Bearer ") if header.startswith("Bearer ") else "",
        ]
        return any(hmac.compare_digest(t.encode(), self.token.encode()) for t in offered if t)


def create_app(feed: Feed, bind_host: str, token: str) -> Starlette:
    """The app; every request must present `token` (the caller makes one)."""
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"the dashboard on {bind_host} needs a token of {MIN_TOKEN_CHARS}+")
    js = plotly_js()

    async def page(request: Request) -> Response:
        response = FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})
        offered = request.query_params.get("token")
        if offered is not None:  # the gate let it in: it is the token
            response.set_cookie(COOKIE, offered, httponly=True, samesite="strict")
        return response

    async def plotly(request: Request) -> Response:
        if js is None:
            return PlainTextResponse(f"plotly is not installed ({INSTALL})", 404)
        return FileResponse(js, headers={"Cache-Control": "max-age=86400"})

    async def state(request: Request) -> Response:
        return JSONResponse(finite(await feed.state()))

    async def events(request: Request) -> Response:
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return Streaming(feed.stream(), media_type="text/event-stream", headers=headers)

    middleware = [Middleware(TokenGate, token=token)]
    if is_loopback(bind_host):
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=LOOPBACK_HOSTS))
    routes: list[Any] = [
        Route("/", page),
        Route("/api/state", state),
        Route("/api/events", events),
        Route("/vendor/plotly.min.js", plotly),
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
    ]
    return Starlette(routes=routes, middleware=middleware)


def bind(host: str, port: int) -> tuple[socket.socket, bool]:
    """A listening socket on host:port, or on a free port when that one is taken; and
    whether it fell back."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    for attempt in (port, 0):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # restart over TIME_WAIT
        try:
            sock.bind((host.strip("[]"), attempt))
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EADDRINUSE or attempt == 0:
                raise
            continue
        sock.listen(128)
        return sock, attempt != port
    raise OSError(f"cannot bind {host}:{port}")


def url_of(sock: socket.socket, host: str, token: str) -> str:
    """The address to open: the bound port; a wildcard host named by this machine's name."""
    port = sock.getsockname()[1]
    shown = socket.gethostname() if host in ("0.0.0.0", "::", "[::]") else host
    shown = f"[{shown}]" if ":" in shown and not shown.startswith("[") else shown
    return f"http://{shown}:{port}/?token={token}"


class _Server(uvicorn.Server):
    """uvicorn's server, whose shutdown first gives the open pages the feed's last update
    (`Feed.close`), so a page open when the run ends shows how it ended."""

    def __init__(self, config: uvicorn.Config, feed: Feed) -> None:
        super().__init__(config)
        self.feed = feed

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self.feed.close()
        await super().shutdown(sockets)


def serve(app: ASGIApp, sock: socket.socket, feed: Feed) -> None:
    """Run `app` on `sock` until SIGINT or SIGTERM: the open pages get `feed`'s last update,
    then their streams end (any still open get a second)."""
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=1,
    )
    _Server(config, feed).run(sockets=[sock])
