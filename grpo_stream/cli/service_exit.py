"""How a service process (`grpo-stream run SERVICE`) ends: without the interpreter's teardown.

A trainer or generator process holds torch, transformers and a model; when it is done,
Python's finalisation (module teardown, then collecting every object one by one) takes
seconds (3.5-6.5 s measured on the 2-core development machine under load, against 0.3 s
for `os._exit`), and `up` waits for every service to exit before the run ends. What a clean
exit must still do is done first: the atexit handlers run (multiprocessing's children,
logging's flush, profilers) and stdout/stderr are flushed; every file the services write
(logs, metrics, checkpoints, journals) is flushed or closed by its owner before this point.

Skipping the teardown also keeps a trainer rank from hanging at exit: torch's gloo process
group joins its worker threads in its destructor while holding the GIL, and a worker still
freeing a finished all-reduce needs the GIL (seen in 2 of 11 runs of a DDP rank on torch
2.13 that destroyed its process group and then dropped its DDP model). So no rank destroys
its process group; the process ends here and the group with it.

A process that still has a non-daemon thread running exits the ordinary way, so the
interpreter joins that thread as it always did.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn

SERVICE_COMMAND = "run"


def is_service_process(argv: list[str]) -> bool:
    """Whether this process is `grpo-stream run SERVICE ...` (not `up`, not a test runner
    that calls the app in-process: those never reach `main`)."""
    return len(argv) > 2 and argv[1] == SERVICE_COMMAND


def end_service_process(code: int) -> NoReturn:
    """Exit with `code`: atexit handlers and stdio flushed, no interpreter teardown."""
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if others:
        raise SystemExit(code)  # the interpreter joins them, as on any ordinary exit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or gone: nothing to flush
            stream.flush()
    os._exit(code)
