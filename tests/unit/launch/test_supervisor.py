"""The supervisor: its processes die with it (a SIGKILLed `up` leaves no service behind); a
service's output lines become events, behind vLLM's process prefix too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import deque

import psutil

from grpo_stream.launch.supervisor import ServiceSpec, parse_line

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


def test_a_json_event_behind_vllms_process_prefix_is_an_event() -> None:
    spec = ServiceSpec("generator-0", "generator", [])
    tail: deque[str] = deque(maxlen=5)
    line = '(EngineCore_DP0 pid=4242) {"event": "library.log", "level": "info", "logger": "vllm"}'
    event = parse_line(spec, tail, line)
    assert event["event"] == "library.log" and event["instance"] == "generator-0"
    raw = parse_line(spec, tail, "(EngineCore_DP0 pid=4242) INFO something plain")
    assert raw["event"] == "raw" and raw["line"].startswith("(EngineCore_DP0 pid=4242)")
