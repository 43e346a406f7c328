"""The supervisor's processes die with it: a SIGKILLed `up` leaves no service behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

LAUNCHER = textwrap.dedent(
    """
    import sys, time
    from grpo_stream.launch.supervisor import ServiceSpec, Supervisor
    sup = Supervisor()
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    proc = sup.start(ServiceSpec("sleeper", "scorer", sleeper))
    print(proc.popen.pid, flush=True)
    time.sleep(600)
    """
)


def test_services_get_sigterm_when_the_launcher_is_killed() -> None:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    assert launcher.stdout is not None
    child = int(launcher.stdout.readline())
    assert psutil.pid_exists(child)
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
            return
        time.sleep(0.1)
    os.kill(child, signal.SIGKILL)
    raise AssertionError("the service outlived its killed launcher")
