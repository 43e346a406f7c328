"""User code named `package.module:attribute` in a setting (a reward, an environment, a
verifiers factory): imported the way `python -m` would, from the working directory first.

Invariant: the directory a process runs in is searched before the installed packages, so a
`my_rewards.py` beside the config works in pre-flight, in the scorer and in its sandboxed
workers alike (services started by `up` run in the directory `up` was started from). A spec
that does not load (not found, or its import raised) raises `UserCodeError` with one line
naming the setting and what was searched.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any


class UserCodeError(ImportError):
    """A `module:attribute` spec does not load; the message is one line naming the setting."""


def import_object(spec: str, setting: str) -> Any:
    """The attribute `spec` (`package.module:attribute`) names; `setting` says where the spec
    came from (e.g. "task.rewards.0.name = 'my_rewards:fn'") for the error."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UserCodeError(f"{setting}: expected 'package.module:attribute'")
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserCodeError(
            f"{setting}: cannot import {module_name}: {exc} (searched the working directory "
            f"{here} and the installed packages; run from the module's directory or set "
            "PYTHONPATH)"
        ) from None
    except Exception as exc:  # user code raised while being imported
        raise UserCodeError(
            f"{setting}: importing {module_name} raised {type(exc).__name__}: {exc}"
        ) from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise UserCodeError(f"{setting}: module {module_name} has no {attr!r}") from None
