"""The sampling record: valid when it exists, read from the wire's struct or the run's
settings, and the seeds of the calls made under it."""

from __future__ import annotations

import pytest

from grpo_stream.config import GeneratorSettings
from grpo_stream.protocols.messages import SamplingParams
from grpo_stream.sampling import Sampling


@pytest.mark.parametrize(
    ("fields", "setting"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 4, "temperature": 0.0}, "temperature"),
        ({"max_tokens": 4, "top_p": 0.0}, "top_p"),
        ({"max_tokens": 4, "top_p": 1.5}, "top_p"),
    ],
)
def test_an_invalid_sampling_is_refused_naming_its_field(
    fields: dict[str, float], setting: str
) -> None:
    with pytest.raises(ValueError, match=rf"^{setting} must"):
        Sampling(**fields)  # type: ignore[arg-type]


def test_it_reads_the_wire_struct_a_prompt_batch_carries() -> None:
    wire = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=12)
    assert Sampling.of(wire, seed=3) == Sampling(max_tokens=12, temperature=0.7, top_p=0.9, seed=3)


def test_it_reads_the_runs_generator_settings() -> None:
    settings = GeneratorSettings(max_tokens=20, temperature=0.5)
    assert Sampling.of(settings) == Sampling(max_tokens=20, temperature=0.5)


def test_child_seeds_are_fixed_by_the_parent_seed_and_the_index() -> None:
    parent = Sampling(8, seed=11)
    seeds = [parent.child(i).seed for i in range(50)]
    assert seeds == [Sampling(8, seed=11).child(i).seed for i in range(50)]
    assert len(set(seeds)) == 50
    assert {parent.child(i).seed for i in range(50)}.isdisjoint(
        {Sampling(8, seed=12).child(i).seed for i in range(3)}
    )


def test_child_seeds_stay_in_the_seed_range_of_torch_and_vllm() -> None:
    assert all(0 <= Sampling(8, seed=2**62).child(i).seed < 2**63 for i in range(4))  # type: ignore[operator]


def test_an_unseeded_sampling_has_unseeded_children() -> None:
    assert Sampling(8).child(5).seed is None


def test_a_child_may_take_fewer_tokens_and_keeps_the_rest() -> None:
    child = Sampling(8, temperature=0.6, top_p=0.9, seed=1).child(2, max_tokens=3)
    assert (child.max_tokens, child.temperature, child.top_p) == (3, 0.6, 0.9)
