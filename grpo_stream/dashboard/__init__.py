"""The run dashboard: a local, read-only web page of a live or finished run.

- `rundir`: what the page shows, read from the run directory (metrics.jsonl, completions.jsonl,
  eval.jsonl, logs/, outcome.json) a little at a time, only the bytes added since the last read;
- `graph`: the service graph (nodes, states, devices, throughput, queues and credits) from the
  hub's Status, or from the logs once the run is over;
- `feed`: the poller, which reads and asks the hub only while a browser is connected, and
  pushes each update to every connected page (server-sent events);
- `server`: the Starlette app (page, static assets, the JSON state, the event stream, the
  token check beyond loopback) and `serve`, which runs it under uvicorn;
- `static/`: the page; its charts use plotly.js as shipped inside the `plotly` package.

Needs the `dashboard` extra (starlette, uvicorn, plotly).
"""

from __future__ import annotations

import importlib.util

EXTRA = ("starlette", "uvicorn", "plotly")
"""What the `dashboard` extra installs (plotly for the copy of plotly.js its package ships)."""
INSTALL = "pip install 'grpo-stream[dashboard]'"
URL_FILE = "dashboard.url"
"""RUN_DIR/dashboard.url: the page's address (with the token where one is needed), 0600."""
TOKEN_FILE = "dashboard.token"
"""RUN_DIR/dashboard.token: the token a dashboard beyond loopback asks for, 0600."""


def missing_extra() -> list[str]:
    """The packages of the `dashboard` extra that are not installed."""
    return [name for name in EXTRA if importlib.util.find_spec(name) is None]
