"""The dashboard that `up` serves beside a run: `grpo-stream dashboard RUN_DIR` as a child
process, started once the hub is up and stopped with the run.

Invariants: the run never depends on it: without the `dashboard` extra, or when it fails to
start or dies, `up` says so once and runs on (it is not restarted); it polls nothing while no
page is open (grpo_stream.dashboard.feed); its output goes to RUN_DIR/logs/dashboard.log,
not to the merged JSON logs of the services.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from grpo_stream.config import RunConfig
from grpo_stream.dashboard import INSTALL, URL_FILE, missing_extra
from grpo_stream.launch.supervisor import die_with_launcher

LOG_FILE = "dashboard.log"
STOP_GRACE_S = 5.0
NICE = 10
"""The dashboard's niceness above `up`'s: the services win any contest for a core."""


def dashboard_argv(run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "grpo_stream.cli.main", "dashboard", str(run_dir)]


class DashboardProcess:
    """The child process and what `up` has said about it."""

    def __init__(self, cfg: RunConfig, note: Callable[[str], None]) -> None:
        self.run_dir = Path(cfg.run.run_dir)
        self.enabled = cfg.dashboard.enabled
        self.note = note
        self.proc: subprocess.Popen[bytes] | None = None
        self._announced = False

    def start(self) -> None:
        if not self.enabled:
            return
        missing = missing_extra()
        if missing:
            self.note(
                f"no dashboard: {', '.join(missing)} not installed ({INSTALL}, or "
                "dashboard.enabled = false)"
            )
            return
        (self.run_dir / URL_FILE).unlink(missing_ok=True)
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        with (self.run_dir / "logs" / LOG_FILE).open("ab") as log:
            self.proc = subprocess.Popen(
                dashboard_argv(self.run_dir),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C at the terminal is for `up`, which stops it
                preexec_fn=_child_setup,
            )

    def poll(self) -> None:
        """Say where the page is once it is served; say once if the process died."""
        if self.proc is None:
            return
        code = self.proc.poll()
        if code is not None:
            self.note(
                f"the dashboard exited with code {code} (see {self.run_dir / 'logs' / LOG_FILE}); "
                "the run goes on without it"
            )
            self.proc = None
            return
        if not self._announced:
            url = _read_url(self.run_dir / URL_FILE)
            if url is not None:
                self.note(f"dashboard at {url}")
                self._announced = True

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def _child_setup() -> None:
    """In the child, before exec: end with `up`, and yield the CPU to the run's services
    (nice +NICE: a page that is open slows no step on a busy machine)."""
    die_with_launcher()
    os.nice(NICE)


def _read_url(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None
