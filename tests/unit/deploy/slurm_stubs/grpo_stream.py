"""Stand-in for `grpo-stream`: records its argv, node and GPUs, and waits for SIGTERM.

STUB_EXITS ("SERVICE=RC@DELAY,...") makes a service exit with RC, DELAY s after every service
(STUB_EXPECT of them) started. The grouper writes hub.addr as the real hub does. `keys init DIR`
writes placeholder files named as `grpo-stream keys init` names them.
"""

import json
import os
import signal
import sys
import time
import tomllib
from pathlib import Path

record = Path(os.environ["STUB_RECORD"])
argv = sys.argv[1:]
if argv[:2] == ["keys", "init"]:
    keys = Path(argv[2])
    (keys / "authorized").mkdir(parents=True)
    for name in ("server", "client", "trainer", "generator", "scorer", "evaluator"):
        (keys / f"{name}.key").write_text(f"public {name}\n")
        (keys / f"{name}.key_secret").write_text(f"secret {name}\n")
        if name != "server":
            (keys / "authorized" / f"{name}.key").write_text(f"public {name}\n")
    sys.exit(0)
service = argv[1]
stopping = False


def on_term(signum: int, frame: object) -> None:
    global stopping
    stopping = True


def note(event: str) -> None:
    line = {
        "event": event,
        "service": service,
        "argv": ["grpo-stream", *argv],
        "node": os.environ.get("SLURMD_NODENAME"),
        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    with record.open("a") as f:
        f.write(json.dumps(line) + "\n")


def wait(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not stopping and time.monotonic() < deadline:
        time.sleep(0.02)


def all_started() -> bool:
    lines = record.read_text().splitlines()
    return sum(json.loads(x)["event"] == "start" for x in lines) >= int(os.environ["STUB_EXPECT"])


signal.signal(signal.SIGTERM, on_term)
note("start")
if service == "grouper":
    value = next(a for a in argv if a.startswith("run.run_dir=")).split("=", 1)[1]
    run_dir = Path(tomllib.loads("v = " + value)["v"])
    (run_dir / "hub.addr").write_text("tcp://ready\n")
exits = dict(item.split("=") for item in os.environ.get("STUB_EXITS", "").split(",") if item)
if service in exits:
    rc, delay = exits[service].split("@")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not stopping and not all_started():
        time.sleep(0.02)
    wait(float(delay))
    note("terminated" if stopping else "exit")
    sys.exit(0 if stopping else int(rc))
wait(20)
note("terminated" if stopping else "timeout")
sys.exit(0 if stopping else 3)
