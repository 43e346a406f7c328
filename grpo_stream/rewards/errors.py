"""The error every reward loader raises: one line naming the reward and what is wrong."""

from __future__ import annotations


class RewardLoadError(ValueError):
    """A reward spec names nothing loadable, or its params do not fit the function."""
