"""The engine interface's argument checks, which every engine runs before it samples."""

from __future__ import annotations

import pytest

from grpo_stream.engines.base import check_generate, check_rows


@pytest.mark.parametrize(
    ("prompts", "group_size", "error"),
    [([], 2, "at least one prompt"), (["1+2="], 0, "group_size must be at least 1")],
)
def test_generate_without_a_prompt_or_a_completion_is_refused(
    prompts: list[str], group_size: int, error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        check_generate(prompts, group_size)


@pytest.mark.parametrize("rows", [[], [[1, 2], []]])
def test_complete_without_rows_or_with_an_empty_row_is_refused(rows: list[list[int]]) -> None:
    with pytest.raises(ValueError, match="non-empty rows"):
        check_rows(rows)
