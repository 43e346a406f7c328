"""A service process ends with its atexit handlers run and its output flushed, without the
interpreter's teardown; one with a non-daemon thread still running exits the ordinary way."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from grpo_stream.cli.service_exit import is_service_process

SCRIPT = """
import atexit, sys, threading, time
from pathlib import Path
from grpo_stream.cli.service_exit import end_service_process

out = Path(sys.argv[1])
atexit.register(lambda: (out / "atexit").write_text("ran"))

class Teardown:
    def __del__(self):  # runs only if the interpreter tears the module down
        (out / "teardown").write_text("ran")

keep = Teardown()
if sys.argv[2] == "thread":
    threading.Thread(target=lambda: (time.sleep(0.3), (out / "thread").write_text("done"))).start()
sys.stdout.write("unflushed line")  # no newline, no flush: must still come out
end_service_process(3)
"""


def _run(tmp_path: Path, mode: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "service.py"
    script.write_text(textwrap.dedent(SCRIPT))
    return subprocess.run(
        [sys.executable, str(script), str(tmp_path), mode],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_service_exits_with_its_code_atexit_run_output_flushed_no_teardown(
    tmp_path: Path,
) -> None:
    done = _run(tmp_path, "plain")
    assert done.returncode == 3
    assert done.stdout == "unflushed line"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert not (tmp_path / "teardown").exists()


def test_a_service_with_a_running_thread_exits_the_ordinary_way(tmp_path: Path) -> None:
    done = _run(tmp_path, "thread")
    assert done.returncode == 3
    assert (tmp_path / "thread").read_text() == "done"  # joined before the exit
    assert (tmp_path / "teardown").exists()  # the ordinary teardown ran


def test_only_grpo_stream_run_is_a_service_process() -> None:
    assert is_service_process(["grpo-stream", "run", "trainer", "--hub", "tcp://h:1"])
    assert not is_service_process(["grpo-stream", "up"])
    assert not is_service_process(["grpo-stream", "run"])
