"""How the vllm engine takes a new weights version: fetched once, checked, then loaded through
vLLM's own protocol with generation paused.

Invariants:
- One update at a time (`_lock`); `version` changes only after vLLM resumed on the new weights.
- A full version: checked against the checkpoint (names, shapes, completeness) before
  anything reaches vLLM; then pause, transfer (start, update, finish, labelled with the
  version), resume. Pause mode: "wait" (running requests finish on the old weights, new ones
  queue) unless in flight ("keep": running requests freeze and continue on the new weights;
  `keep_kv` false clears the cache so their KV is recomputed under them).
- A transfer that fails inside vLLM is refused (`weights.update_refused`): the engine stays
  paused, the held version is dropped, the newest version is fetched again in full and
  transferred again. A second failure raises VLLMUpdateFailed with the engine still paused:
  it never generates on half-applied weights (the generator exits; `up` restarts it).
- A LoRA adapter version (`split_adapter`) goes through the same fetch and checks, then is
  added as vLLM's current adapter without a pause: vLLM binds an adapter to a request for the
  request's life, so a request runs wholly on the version it was submitted with (`acquire`
  says which) and an older adapter is removed once no request uses it (`release`).
- A background update (`start_background`) runs fetch and apply on one worker thread; its
  result or error waits in `take_background`.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from grpo_stream.config.transport import SecuritySettings, TransportSettings, WeightsSettings
from grpo_stream.engines.base import to_torch
from grpo_stream.engines.lora import VLLMAdapter
from grpo_stream.engines.streaming import EngineFailed
from grpo_stream.engines.vllm import compat as compat
from grpo_stream.engines.vllm.loop import Loop
from grpo_stream.engines.vllm.weights import TIED_HEAD, CheckpointShapes, write_handoff
from grpo_stream.models.adapter import split_adapter
from grpo_stream.transport.fetcher import VersionFetcher

if TYPE_CHECKING:
    from grpo_stream.transport.fetch import Arrays

log = structlog.get_logger()
T = TypeVar("T")
Refetch = Callable[[], tuple[int, "Arrays"]]
DEAD_GRACE_S = 5.0  # how long a failed call waits for vLLM to say its engine died
Handoff = tuple[Path, list[str]]  # the hand-off file and the tensor names it holds


class VLLMEngineDied(EngineFailed):
    """vLLM's engine core (or a worker) died: the generator exits and `up` restarts it."""


class VLLMUpdateFailed(EngineFailed):
    """A version failed inside vLLM twice: the engine stays paused, the generator exits."""


class UpdateRefused(RuntimeError):
    """vLLM raised while loading a version (its engine still alive)."""


class Updater:
    """The vllm engine's weights: version held, fetcher, checks, pause and transfer."""

    def __init__(
        self,
        llm: Any,
        loop: Loop,
        fetcher: VersionFetcher,
        shapes: CheckpointShapes,
        adapter: VLLMAdapter | None = None,
    ) -> None:
        self.llm = llm
        self.loop = loop
        self.fetcher = fetcher
        self.shapes = shapes
        self.adapter = adapter
        self.version = 0
        self.inflight = False  # generator.inflight_updates: pause "keep" instead of "wait"
        self.keep_kv = False  # generator.inflight_kv = "keep": a kept request keeps its KV
        self.paused_s: list[float] = []  # per update: seconds from pause to resume
        self.refused = 0  # transfers that failed inside vLLM
        self._lock = threading.Lock()
        self._gate = threading.Lock()  # the adapter a request takes, and its use counts
        self._uses: Counter[int] = Counter()  # requests running on each LoRA adapter id
        self._retired: set[int] = set()  # replaced adapters still in use
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future[int] | None = None

    @classmethod
    def start(
        cls,
        llm: Any,
        loop: Loop,
        path: str,
        transport: TransportSettings,
        security: SecuritySettings,
        weights: WeightsSettings,
        lora: bool,
        model_name: str,
        secret: bytes | None = None,
    ) -> Updater:
        """Initialise vLLM's transfer protocol and label the loaded weights version 0.
        `secret`: the run's, which signs every weights request."""
        loop.run(compat.init_transfer(llm))
        loop.run(compat.label(llm, 0))
        local = local_model_dir(path)
        shapes = CheckpointShapes.of_directory(local, tied=False)
        shapes.tied = TIED_HEAD not in shapes.shapes  # a tied head is not saved
        updater = cls(llm, loop, VersionFetcher(transport, security, weights, secret), shapes)
        if lora:
            updater.adapter = VLLMAdapter(
                lambda req: bool(loop.run(llm.add_lora(req))),
                lambda lora_id: bool(loop.run(llm.remove_lora(lora_id))),
                local,
                model_name,
            )
        return updater

    def acquire(self) -> tuple[Any, int]:
        """For a new request: the LoRARequest it runs with (None: the base model, or full
        weights) and that adapter's version. Each call must be matched by `release`."""
        with self._gate:
            request = None if self.adapter is None else self.adapter.request
            if request is not None:
                self._uses[request.lora_int_id] += 1
            return request, self.version

    def release(self, lora_id: int) -> None:
        """A request on adapter `lora_id` (0: none) ended; a replaced adapter no request uses
        any more is removed."""
        if lora_id == 0 or self.adapter is None:
            return
        with self._gate:
            self._uses[lora_id] -= 1
            done = lora_id in self._retired and self._uses[lora_id] <= 0
            if done:
                self._retired.discard(lora_id)
                del self._uses[lora_id]
        if done:
            self.adapter.remove(lora_id)

    # ---- one update -------------------------------------------------------------------

    def update_from_server(self, address: str, version: int) -> int:
        got, named = self.fetcher.fetch(address, version)
        return self.apply(named, got, refetch=lambda: self.fetcher.fetch(address, version))

    def apply(self, named: Any, version: int, refetch: Refetch | None = None) -> int:
        """Apply a whole version (full weights or a LoRA adapter); the version applied."""
        with self._lock:
            found = split_adapter([(name, to_torch(value)) for name, value in named])
            if found is not None:
                return self._swap_adapter(found[0], found[1], version)
            self.shapes.check(named)
            handoff = write_handoff(named, version)  # before the pause: generation goes on
            mode: compat.PauseMode = "keep" if self.inflight else "wait"
            start = time.perf_counter()
            clear = not (self.inflight and self.keep_kv)  # keep_kv: kept requests keep their KV
            self._call(compat.pause(self.llm, mode, clear_cache=clear))
            version = self._transfer(handoff, version, refetch)  # raises with the engine paused
            self._call(compat.resume(self.llm))
            return self._applied(version, mode, start)

    def _transfer(self, handoff: Handoff, version: int, refetch: Refetch | None) -> int:
        """Load the hand-off into vLLM. If vLLM fails, once: drop the held version, fetch the
        newest in full and load that (generation stays paused throughout)."""
        try:
            return self._load(handoff, version)
        except UpdateRefused as exc:
            if refetch is None:
                failed = f"vLLM failed to load weights version {version}: {exc}"
                raise VLLMUpdateFailed(failed) from exc
        self.fetcher.forget()  # the held version may be what failed: fetch it whole
        version, named = refetch()
        self.shapes.check(named)
        try:
            return self._load(write_handoff(named, version), version)
        except UpdateRefused as exc:
            raise VLLMUpdateFailed(
                f"vLLM failed to load weights version {version} twice ({exc}); generation "
                "stays paused"
            ) from exc

    def _load(self, handoff: Handoff, version: int) -> int:
        """start, update, finish in vLLM; UpdateRefused when vLLM raised (its engine alive)."""
        path, names = handoff
        try:
            info = {"path": str(path), "names": names, "version": version}
            self._call(compat.transfer(self.llm, info, version))
            return version
        except Exception as exc:
            self._raise_if_dead(exc)
            self.refused += 1
            log.error("weights.update_refused", version=version, error=str(exc)[:500])
            raise UpdateRefused(str(exc)[:200]) from exc
        finally:
            path.unlink(missing_ok=True)

    def _swap_adapter(self, manifest: Any, tensors: Any, version: int) -> int:
        if self.adapter is None:
            raise ValueError(
                "a LoRA adapter version reached a generator without LoRA: set "
                "trainer.lora.enabled the same on the trainer and the generators"
            )
        start = time.perf_counter()
        with self._gate:  # no request takes an adapter while the current one changes
            previous = self.adapter.apply(manifest, tensors, version)
            self.version = version
            unused = previous is not None and self._uses[previous.lora_int_id] <= 0
            if previous is not None and not unused:
                self._retired.add(previous.lora_int_id)
        if unused:
            self.adapter.remove(previous.lora_int_id)
        return self._applied(version, "none (LoRA)", start)

    def _applied(self, version: int, mode: str, start: float) -> int:
        self.version = version
        paused = time.perf_counter() - start
        self.paused_s.append(paused)
        log.info(
            "engine.weights_loaded",
            engine="vllm",
            version=version,
            pause=mode,
            paused_s=round(paused, 4),
            fetches=self.fetcher.fetches,
        )
        return version

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """A pause, resume or label call; its failure leaves vLLM's state unknown: the engine
        cannot go on (VLLMEngineDied or VLLMUpdateFailed)."""
        try:
            return self.loop.run(coro)
        except Exception as exc:
            self._raise_if_dead(exc)
            raise VLLMUpdateFailed(f"vLLM failed around an update: {exc!r}") from exc

    def _raise_if_dead(self, exc: BaseException) -> None:
        """VLLMEngineDied if `exc` came from a dead engine. vLLM marks its engine dead a moment
        after a worker's death can already fail a call (measured: a pause failed "cancelled"
        first), so an error is looked at again for up to DEAD_GRACE_S."""
        deadline = time.monotonic() + DEAD_GRACE_S
        while not (compat.is_dead_error(exc) or compat.is_dead(self.llm)):
            if time.monotonic() >= deadline:
                return
            time.sleep(0.1)
        raise VLLMEngineDied(f"vLLM's engine core died during an update: {exc!r}") from exc

    # ---- in the background ------------------------------------------------------------

    def start_background(self, address: str) -> bool:
        """Fetch and apply the newest version on a thread; False when one is pending."""
        if self._pending is not None:
            return False
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="vllm-update")
        self._pending = self._pool.submit(self.update_from_server, address, -1)
        return True

    @property
    def background_busy(self) -> bool:
        return self._pending is not None

    def take_background(self) -> int | None:
        """The version the background update applied (None: still running); re-raises."""
        if self._pending is None or not self._pending.done():
            return None
        pending, self._pending = self._pending, None
        return pending.result()

    def close(self) -> None:
        if self.adapter is not None:
            self.adapter.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self.fetcher.close()


def local_model_dir(path: str) -> str:
    """A local directory holding the model's safetensors (the Hugging Face cache for a name)."""
    if Path(path).is_dir():
        return path
    from huggingface_hub import snapshot_download

    return str(snapshot_download(path, allow_patterns=["*.safetensors", "*.json"]))
