"""Worker code for the sandbox pool's tests: each `load` runs in a worker process (forked from
the fork server, which imports this module by the name the parent pickled it under)."""

from __future__ import annotations

import os
import time
from multiprocessing.connection import Connection
from typing import Any

from grpo_stream.sandbox.worker import Handler, pack


def echo(conn: Connection, tag: str) -> Handler:
    """Answers each message with ["echo", tag, pid]; ["hang"] never returns; ["hog", mb]
    allocates mb megabytes and says whether it could."""

    def handle(message: list[Any]) -> None:
        if message[0] == "hang":
            time.sleep(3600)
        if message[0] == "hog":
            try:
                block = bytearray(int(message[1]) << 20)
            except MemoryError:
                conn.send_bytes(pack(["memory"]))
                return
            conn.send_bytes(pack(["allocated", len(block) >> 20]))
            return
        conn.send_bytes(pack(["echo", tag, os.getpid()]))

    return handle


def fails(conn: Connection) -> Handler:
    raise ImportError("cannot import name 'nope' from 'user_code'")


def exits(conn: Connection) -> Handler:
    os._exit(3)


def sleeps(conn: Connection, seconds: float) -> Handler:
    time.sleep(seconds)
    return echo(conn, "slow")
