"""The rehearsed GPU image (tests/unit/bench/rehearsal.py), built once for the session's
slow rehearsals of bench/gpu_check.sh and bench/gpu_scale.sh."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from rehearsal import Image, build_image


@pytest.fixture(scope="session")
def gpu_image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    return build_image(tmp_path_factory.mktemp("gpu-image"))
