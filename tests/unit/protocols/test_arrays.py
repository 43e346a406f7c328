"""protocols/arrays.py: ml_dtypes (about a second of CPU to import) is loaded when a bfloat16
array first travels, not by every process that speaks the protocol; each check runs in a
fresh process, where nothing else has imported it yet."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import torch

from grpo_stream.protocols import WeightsChunk, encode

MOVES_FP32 = """
import sys
import numpy as np
from grpo_stream.protocols import WeightsChunk, decode, encode
arrays = [np.arange(6, dtype=np.float32), np.arange(3, dtype=np.int64)]
back = decode(encode(WeightsChunk(1, 0, 1, ["a", "b"], arrays)))
print([a.dtype.name for a in back.tensors], "ml_dtypes" in sys.modules)
"""

DECODES = """
import sys
from pathlib import Path
from grpo_stream.protocols import decode
files = sorted(Path(sys.argv[1]).iterdir())
back = decode([f.read_bytes() for f in files])
print(back.tensors[0].dtype.name, back.tensors[0].astype("float32").tolist())
"""


def _python(code: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_a_process_moving_no_bfloat16_never_imports_ml_dtypes() -> None:
    assert _python(MOVES_FP32) == "['float32', 'int64'] False"


def test_a_process_that_never_imported_ml_dtypes_decodes_bfloat16(tmp_path: Path) -> None:
    tensor = torch.tensor([1.5, -2.25, 3e38], dtype=torch.bfloat16)
    frames = encode(WeightsChunk(1, 0, 1, ["x"], [cast(Any, tensor)]))
    for i, frame in enumerate(frames):
        (tmp_path / f"{i:03d}").write_bytes(bytes(frame))
    assert _python(DECODES, str(tmp_path)) == f"bfloat16 {tensor.float().tolist()}"
