"""The generator service on the vllm engine (real vLLM, real ZeroMQ to a scripted hub): each
prompt is its own request, each group reaches the hub as soon as it is done (a short batch
sent after a long one overtakes it), credits come back per group, versions are applied in
flight with per-token versions on the wire, and a hub restart aborts what was held. Last, a
killed vLLM worker ends the engine's requests with the named VLLMEngineDied (it kills this
module's engine: keep it last).

Run on the CPU build with `LD_PRELOAD=$VIRTUAL_ENV/lib/libiomp5.so pytest -m gpu ...`.
vLLM starts once for this module.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_stream.config import RunConfig, config_from_dict
from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.protocols import messages as m
from grpo_stream.sampling import Sampling

sys.path.insert(0, str(Path(__file__).parents[2] / "session"))
sys.path.insert(0, str(Path(__file__).parents[2] / "services"))
sys.path.insert(0, str(Path(__file__).parent))
from generator_harness import Serving, prompt_batch
from hub_script import ScriptedHub
from vllm_checks import vllm_worker_of

pytestmark = pytest.mark.gpu


def run_config(tmp: Path, inflight: bool = False) -> RunConfig:
    return config_from_dict(
        {
            "run": {"run_dir": str(tmp)},
            "generator": {
                "engine": "vllm",
                "prompts_per_request": 2,
                "group_size": 4,
                "inflight_updates": inflight,
            },
            "transport": {"heartbeat_interval_s": 0.1, "heartbeat_timeout_s": 3.0},
        }
    )


@pytest.fixture(scope="module")
def engine(tiny_dir: Path) -> Iterator[Any]:
    pytest.importorskip("vllm")
    from grpo_stream.config import GeneratorSettings, ModelSettings
    from grpo_stream.engines.vllm.engine import VLLMEngine

    eng = VLLMEngine.from_settings(
        ModelSettings(name_or_path=str(tiny_dir), dtype="float32"),
        GeneratorSettings(gpu_memory_utilization=0.05),
        TransportSettings(),
        SecuritySettings(),
        max_model_len=128,
    )
    yield eng
    eng.close()


def batch(lease_id: int, gids: list[int], max_tokens: int, min_version: int = 0) -> m.PromptBatch:
    return prompt_batch(lease_id, gids, ["3+4=", "12+34="], 4, max_tokens, min_version)


def test_a_short_batch_sent_after_a_long_one_reaches_the_hub_first(
    engine: Any, tmp_path: Path, tokenizer: Any
) -> None:
    hub = ScriptedHub(run_config(tmp_path))
    serving = Serving(hub.address, engine)
    try:
        assert hub.wait_for(m.WorkRequest)[0].credits == 4  # type: ignore[attr-defined]
        hub.send("gen-0", batch(lease_id=1, gids=[10, 11], max_tokens=100))
        hub.send("gen-0", batch(lease_id=2, gids=[20, 21], max_tokens=1))
        rollouts = hub.wait_for(m.Rollout, count=4, timeout_s=120)
        leases = [r.lease_id for r in rollouts]  # type: ignore[attr-defined]
        assert leases[:2] == [2, 2] and sorted(leases[2:]) == [1, 1]
        for r in rollouts:
            assert isinstance(r, m.Rollout) and r.policy_version == engine.version
            assert len(r.texts) == 4 and r.completion_offsets[-1] == len(r.completion_ids)
            assert len(r.logprobs) == len(r.completion_ids)
            prompt = {10: "3+4=", 20: "3+4=", 11: "12+34=", 21: "12+34="}[r.group_id]
            assert list(r.prompt_ids) == tokenizer(prompt)["input_ids"]
            assert len(r.token_versions) == 0  # one version sampled every token
        time.sleep(0.3)
        given_back = sum(w.credits for w in hub.of(m.WorkRequest)[1:])  # type: ignore[attr-defined]
        assert given_back == 4  # one credit per group sent
    finally:
        serving.close()
        hub.close()


def test_in_flight_a_rollout_carries_the_versions_of_its_tokens(
    engine: Any, tmp_path: Path, tiny_dir: Path
) -> None:
    import zmq

    from grpo_stream.hub.guard import check_rollout
    from grpo_stream.models.loading import load_policy
    from grpo_stream.transport.weights import WeightServer

    ctx: zmq.Context[Any] = zmq.Context()
    server = WeightServer(ctx, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", TransportSettings(),
                          SecuritySettings())  # fmt: skip
    hub = ScriptedHub(run_config(tmp_path, inflight=True))
    addresses = server.addresses
    hub.peers = m.Endpoints(weights=addresses["weights"], announce=addresses["announce"])
    engine.enable_inflight(lambda: None)
    model = load_policy(str(tiny_dir), dtype="float32", trainable=False)
    old = engine.version
    serving = Serving(hub.address, engine)
    try:
        hub.wait_for(m.WorkRequest)
        split: list[m.Rollout] = []
        for attempt in range(3):  # the version must land while a request runs
            new = old + 1 + attempt
            lease = 3 + attempt
            hub.send("gen-0", batch(lease_id=lease, gids=[2 * lease, 2 * lease + 1],
                                    max_tokens=100, min_version=new - 1))  # fmt: skip
            time.sleep(0.2)
            with torch.no_grad():
                named = [(n, p + 0.01 * new) for n, p in model.named_parameters()]
            server.publish(new, named)
            got = hub.wait_for(m.Rollout, count=2, timeout_s=120,
                               where=lambda r, lease=lease: r.lease_id == lease)  # type: ignore[attr-defined,misc]  # fmt: skip
            split = [r for r in got if len(r.token_versions) > 1]  # type: ignore[misc]
            if split:
                break
        assert split, "no group ran across an update in 3 tries"
        for r in split:
            assert check_rollout(r, 4) is None  # the hub's own check of the runs
            assert set(r.token_versions.tolist()) == {new - 1, new}  # runs restart per completion
            assert r.policy_version == new - 1  # the oldest: what the staleness gate counts
    finally:
        serving.close()
        engine.enable_inflight(None)
        hub.close()
        server.close()
        ctx.destroy(linger=0)


def test_after_a_hub_restart_the_running_requests_are_aborted(engine: Any, tmp_path: Path) -> None:
    """vLLM is paused (as for an in-flight update) while the hub restarts, so the requests
    are surely running when the generator rejoins: on a quiet machine a random tiny model's
    groups can finish within the 0.3 s the rejoin takes, and a group finished before the
    rejoin is rightly sent."""
    from grpo_stream.engines.vllm import compat as compat

    cfg = run_config(tmp_path)
    hub = ScriptedHub(cfg)
    serving = Serving(hub.address, engine)
    again: ScriptedHub | None = None
    paused = False
    try:
        hub.wait_for(m.WorkRequest)
        for lease in (9, 10, 11):  # until requests are caught running by the pause
            hub.send("gen-0", batch(lease_id=lease, gids=[10 * lease, 10 * lease + 1],
                                    max_tokens=120))  # fmt: skip
            deadline = time.monotonic() + 60
            while engine.running == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            engine.updater.loop.run(compat.pause(engine.llm, "keep", clear_cache=False))
            paused = True
            if engine.running:
                break
            engine.updater.loop.run(compat.resume(engine.llm))
            paused = False
            hub.wait_for(m.Rollout, count=2 * (lease - 8), timeout_s=60)  # its credits back
        assert paused and engine.running > 0, "no request was running at any pause"
        hub.close()
        again = ScriptedHub(cfg, address=hub.address)
        # the rejoin asks for its full credits (a group's credit sent before the generator
        # saw the restart may reach the new hub first)
        again.wait_for(m.WorkRequest, timeout_s=30, where=lambda w: w.credits == 4)  # type: ignore[attr-defined]
        deadline = time.monotonic() + 30
        while engine.running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.running == 0  # aborted, not run to the end for nobody
        engine.updater.loop.run(compat.resume(engine.llm))
        paused = False
        time.sleep(0.5)
        assert again.of(m.Rollout) == []
    finally:
        if paused:
            engine.updater.loop.run(compat.resume(engine.llm))
        serving.close()
        if again is not None:
            again.close()


def test_a_killed_vllm_worker_ends_the_requests_with_the_named_error(engine: Any) -> None:
    """The module's last test: it kills the engine."""
    from grpo_stream.engines.vllm.update import VLLMEngineDied

    ids = engine.encode(["12+34="])[0]
    engine.submit("long", ids, group_size=8, sampling=Sampling(max_tokens=120, seed=0))
    vllm_worker_of(os.getpid()).send_signal(signal.SIGKILL)
    with pytest.raises(VLLMEngineDied):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            engine.take_finished(timeout_s=0.5)
    with pytest.raises(VLLMEngineDied):  # and any later call says so too
        engine.generate(["1+2="], group_size=2, sampling=Sampling(max_tokens=4))
