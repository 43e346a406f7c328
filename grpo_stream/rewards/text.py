"""Small text helpers shared by the reward functions (pure, bounded work)."""

from __future__ import annotations

import re
from functools import lru_cache


@lru_cache(maxsize=64)
def _tag_pattern(tag: str) -> re.Pattern[str]:
    return re.compile(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", re.DOTALL)


def tagged(text: str, tag: str) -> str | None:
    """The content of the last complete `<tag>...</tag>` in `text`, or None."""
    found = _tag_pattern(tag).findall(text)
    return str(found[-1]) if found else None
