"""The hf engine fetching weights from a real WeightServer over ZeroMQ (loopback)."""

from __future__ import annotations

from typing import Any

import torch

from grpo_stream.engines.hf import HFEngine
from grpo_stream.sampling import Sampling
from grpo_stream.transport.weights import WeightServer

PROMPTS = ["1+2=", "12+34="]


def trained_copy(model: Any) -> dict[str, torch.Tensor]:
    """What a trainer would publish: the same architecture with different weights."""
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        return {
            name: p.detach() + 0.05 * torch.randn(p.shape, generator=gen)
            for name, p in model.named_parameters()
        }


def test_update_from_server_applies_the_published_version(
    hf_engine: HFEngine, weight_server: WeightServer
) -> None:
    new = trained_copy(hf_engine.model)
    weight_server.publish(4, new.items())
    got = hf_engine.update_from_server(weight_server.addresses["weights"], -1)
    assert got == 4
    assert hf_engine.version == 4
    for name, param in hf_engine.model.named_parameters():
        assert torch.equal(param.detach(), new[name])


def test_update_from_server_changes_behaviour_logprobs(
    hf_engine: HFEngine, weight_server: WeightServer
) -> None:
    before = hf_engine.generate(PROMPTS, group_size=2, sampling=Sampling(max_tokens=4, seed=0))
    weight_server.publish(1, trained_copy(hf_engine.model).items())
    hf_engine.update_from_server(weight_server.addresses["weights"], 1)
    after = hf_engine.generate(PROMPTS, group_size=2, sampling=Sampling(max_tokens=4, seed=0))
    first = [g.completions[0].logprobs[0] for g in before]
    assert first != [g.completions[0].logprobs[0] for g in after]


def test_tied_lm_head_follows_the_embedding_sent_once(
    hf_engine: HFEngine, weight_server: WeightServer
) -> None:
    new = trained_copy(hf_engine.model)
    new["lm_head.weight"] = new["model.embed_tokens.weight"]  # tied: same storage
    snapshot = weight_server.publish(2, new.items())
    assert snapshot.aliases == {"lm_head.weight": "model.embed_tokens.weight"}
    hf_engine.update_from_server(weight_server.addresses["weights"], -1)
    model = hf_engine.model
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(model.lm_head.weight.detach(), new["model.embed_tokens.weight"])


def test_a_version_fetched_in_the_background_is_swapped_in_mid_batch(
    hf_engine: HFEngine, weight_server: WeightServer
) -> None:
    new = trained_copy(hf_engine.model)
    weight_server.publish(3, new.items())
    address = weight_server.addresses["weights"]
    swapped_at: list[int] = []
    steps: list[int] = []

    def between_steps() -> None:  # what the generator does in flight, step by step
        steps.append(1)
        if len(steps) == 1:
            assert hf_engine.fetch_in_background(address)
            assert not hf_engine.fetch_in_background(address)  # one pending at a time
        got = hf_engine.take_fetched()
        if got is not None:
            swapped_at.append(len(steps))

    hf_engine.enable_inflight(between_steps)
    deadline = 200  # steps: the fetch finishes on its thread while the batch decodes
    groups = hf_engine.generate(PROMPTS, group_size=2, sampling=Sampling(max_tokens=deadline))
    assert len(swapped_at) == 1 and hf_engine.version == 3
    runs = [c.version_runs for g in groups for c in g.completions]
    assert [(0, 0), (swapped_at[0], 3)] in runs  # the rows still decoding switched there
    for name, param in hf_engine.model.named_parameters():
        assert torch.equal(param.detach(), new[name])
