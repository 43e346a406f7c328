"""What the trainer refuses before it splits sequences, each in one line naming
trainer.context_parallel."""

from __future__ import annotations

from typing import Any

import pytest

from grpo_stream.config.trainer import check_context_heads


def test_a_degree_that_does_not_divide_the_heads_is_refused_with_the_divisors() -> None:
    with pytest.raises(ValueError) as err:
        check_context_heads(3, 4, "some/model")
    message = str(err.value)
    assert message.startswith("trainer.context_parallel = 3 does not divide the 4 attention")
    assert "[1, 2, 4]" in message and "\n" not in message


def test_a_degree_that_divides_the_heads_passes() -> None:
    check_context_heads(4, 8, "some/model")
    check_context_heads(1, 7, "some/model")  # no context parallelism: nothing to divide


@pytest.mark.slow  # reads the two spawned ranks' results (conftest.py)
def test_a_model_whose_attention_bypasses_the_interface_is_refused(
    group_results: list[dict[str, Any]],
) -> None:
    for rank in group_results:
        message = rank["refused"]
        assert message.startswith("trainer.context_parallel = 2: local-attention gives other")
        assert "\n" not in message
