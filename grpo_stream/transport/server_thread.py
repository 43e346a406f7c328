"""A ROUTER served from its own thread: the weight server, a generator's relay, its payload
store. One lifecycle for all of them.

Invariants:
- The thread creates, uses and closes the socket (a ZeroMQ socket belongs to one thread);
  the owner talks to the serving code only through state it guards itself.
- The constructor returns once the socket is bound (`address` resolved), or raises
  TransportError naming the server and the address, so a bind failure is one line at start
  (`ExposedBind` as it is: it names the setting; `guarded`, `setting`: see `sockets._Bound`).
- A `serve` that raises is logged (`<name>.server_failed`) and recorded in `failure`; the
  socket is closed either way. `close` stops the loop and joins the thread.
- The thread runs in a copy of the creator's context, so its log lines keep the fields
  bound to the service.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable

import structlog

from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.transport.errors import ExposedBind, TransportError
from grpo_stream.transport.sockets import Context, Server

log = structlog.get_logger()

START_TIMEOUT_S = 30.0
"""How long the constructor waits for the thread to bind."""
JOIN_TIMEOUT_S = 10.0
"""How long `close` waits for the thread (its loop polls at most every few hundred ms)."""

Serve = Callable[[Server, threading.Event], None]
"""The serving loop: runs until the event is set (it polls the server with a timeout)."""


class ServerThread:
    """`serve(server, stop)` on a `Server` bound at `bind`, in a background thread."""

    def __init__(
        self,
        ctx: Context,
        bind: str,
        settings: TransportSettings,
        security: SecuritySettings,
        name: str,
        serve: Serve,
        guarded: bool = False,
        setting: str = "",
    ) -> None:
        self.name = name
        self._guarded, self._setting = guarded, setting
        self.address = ""
        self.failure: BaseException | None = None  # why serving stopped, if it failed
        self._start_failure: BaseException | None = None
        self._stop = threading.Event()
        ready = threading.Event()
        self._thread = threading.Thread(
            target=contextvars.copy_context().run,
            args=(self._run, ctx, bind, settings, security, serve, ready),
            name=f"{name}-server",
            daemon=True,
        )
        self._thread.start()
        if not ready.wait(timeout=START_TIMEOUT_S):
            self._stop.set()
            self._start_failure = TimeoutError(f"no bind within {START_TIMEOUT_S} s")
        if isinstance(self._start_failure, ExposedBind):
            raise self._start_failure
        if self._start_failure is not None:
            raise TransportError(f"{name} server failed to start on {bind}: {self._start_failure}")

    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=JOIN_TIMEOUT_S)

    def _run(
        self,
        ctx: Context,
        bind: str,
        settings: TransportSettings,
        security: SecuritySettings,
        serve: Serve,
        ready: threading.Event,
    ) -> None:
        try:
            server = Server(
                ctx,
                bind,
                settings,
                security,
                self.name,
                guarded=self._guarded,
                setting=self._setting,
            )
        except Exception as exc:  # reported to __init__, which raises it in the caller
            self._start_failure = exc
            ready.set()
            return
        self.address = server.address
        ready.set()
        try:
            serve(server, self._stop)
        except Exception as exc:
            self.failure = exc
            log.exception(f"{self.name}.server_failed")
        finally:
            server.close()
