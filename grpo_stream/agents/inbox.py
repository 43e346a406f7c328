"""Where the endpoint's server thread and the generator's main thread meet.

The server thread looks episodes up by the secret in their URL, claims one request at a time
per episode, and leaves `TurnRequest`s here; the main thread takes them (woken through a
socket pair it can wait on beside the agent workers' pipes) and answers each through its
future. Everything shared is behind one lock; nothing here touches the engine.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections import deque

from grpo_stream.agents.episode import AgentEpisode, TurnRequest
from grpo_stream.sampling import Sampling


class Inbox:
    """Open episodes by secret, and the requests waiting for the main thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._episodes: dict[str, AgentEpisode] = {}
        self._queue: deque[TurnRequest] = deque()
        self._wake_recv, self._wake_send = socket.socketpair()
        self._wake_recv.setblocking(False)
        self._wake_send.setblocking(False)
        self.sampling = Sampling(max_tokens=64)  # the run's, which every request is served under

    def fileno(self) -> int:
        """Readable when requests are waiting (for `multiprocessing.connection.wait`)."""
        return self._wake_recv.fileno()

    def open(self, episodes: list[AgentEpisode]) -> None:
        with self._lock:
            self._episodes.update({ep.secret: ep for ep in episodes})

    def close(self, episodes: list[AgentEpisode]) -> None:
        with self._lock:
            for ep in episodes:
                self._episodes.pop(ep.secret, None)
                ep.done = True

    def episode(self, secret: str) -> AgentEpisode | None:
        with self._lock:
            return self._episodes.get(secret)

    def claim(self, ep: AgentEpisode) -> str | None:
        """Mark a request of `ep` in flight; why not when another one is or it is over."""
        with self._lock:
            if ep.done:
                return "this episode is over (its agent finished or was stopped)"
            if ep.busy:
                return "a request of this episode is in flight: an episode is one conversation"
            ep.busy = True
            return None

    def release(self, ep: AgentEpisode) -> None:
        with self._lock:
            ep.busy = False

    def put(self, request: TurnRequest) -> None:
        with self._lock:
            self._queue.append(request)
        with contextlib.suppress(BlockingIOError):  # a full pipe already wakes the reader
            self._wake_send.send(b"x")

    def take(self) -> list[TurnRequest]:
        """Every waiting request, oldest first."""
        with contextlib.suppress(BlockingIOError):
            while self._wake_recv.recv(4096):
                pass
        with self._lock:
            out = list(self._queue)
            self._queue.clear()
        return out

    def shutdown(self) -> None:
        self._wake_recv.close()
        self._wake_send.close()
