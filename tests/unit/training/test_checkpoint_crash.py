"""A process killed (SIGKILL) while writing a checkpoint leaves the previous one usable."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from transformers import GPT2LMHeadModel

from grpo_stream.training.checkpoint import latest_checkpoint

WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from grpo_stream.models.testing import tiny_gpt2
    from grpo_stream.training.checkpoint import save_checkpoint

    run = Path(sys.argv[1])
    small = tiny_gpt2(vocab=32, positions=16)
    save_checkpoint(run, 1, small, None, {"step": 1}, keep=5)
    big = tiny_gpt2(vocab=32, hidden=768, layers=12, heads=8, positions=64)
    print("saving", flush=True)
    for step in range(2, 100):
        save_checkpoint(run, step, big, None, {"step": step}, keep=100)
    """
)


def test_kill_during_save_leaves_previous_checkpoint(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    lines = iter(proc.stdout.readline, "")  # structlog's default output shares stdout
    assert any(line.strip() == "saving" for line in lines)
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = list((tmp_path / "checkpoints").glob(".tmp-step-*"))
    assert partial, "the kill should land while a checkpoint is being written"
    latest = latest_checkpoint(tmp_path)
    assert latest is not None
    GPT2LMHeadModel.from_pretrained(latest)  # the newest complete one loads
