"""One harness for the generator's tests (tests/unit/services, tests/unit/engines/vllm): the
generator's `serve` in a thread against a scripted hub (tests/unit/session/hub_script.py), a
connected session for tests that drive its parts, and PromptBatches."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from grpo_stream.config.transport import SecuritySettings
from grpo_stream.protocols import messages as m
from grpo_stream.services.generator import Generator
from grpo_stream.session.service import Join, Session, StopFlag

ANSWERS = {"3+4=": "7", "2+2=": "4", "12+34=": "46"}
"""The prompts batches may carry, with their references."""


def connected(hub_address: str, instance: str = "g-test") -> Session:
    """A generator's session joined to the hub at `hub_address` (close it when done)."""
    session = Session(Join("generator", instance, hub_address, SecuritySettings()), StopFlag())
    session.connect()
    return session


class Serving:
    """Generator.serve in a thread (its session lives there) as `gen-0`, stopped by the test;
    what it raised fails `close`."""

    def __init__(self, hub_address: str, engine: Any) -> None:
        self.stop = StopFlag()
        self.gen: Generator | None = None
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._engine = engine
        self._join = Join("generator", "gen-0", hub_address, SecuritySettings())
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self._ready.wait(30)

    def _run(self) -> None:
        session = Session(self._join, self.stop)
        session.connect()
        try:
            self.gen = Generator(session, self._engine)
            self._ready.set()
            self.gen.serve()
        except BaseException as exc:
            self.error = exc
        finally:
            session.close("done")

    def close(self) -> None:
        self.stop.stop("test")
        self.thread.join(60)
        assert self.error is None, self.error


def prompt_batch(
    lease_id: int,
    group_ids: list[int],
    prompts: list[str],
    group_size: int,
    max_tokens: int,
    min_version: int = 0,
) -> m.PromptBatch:
    """A PromptBatch of `prompts` (keys of ANSWERS), one group id each."""
    return m.PromptBatch(
        lease_id=lease_id,
        group_ids=np.array(group_ids, np.int64),
        prompts=prompts,
        references=[{"answer": ANSWERS[p]} for p in prompts],
        group_size=group_size,
        min_version=min_version,
        sampling=m.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=max_tokens),
    )
