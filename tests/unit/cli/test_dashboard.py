"""`grpo-stream dashboard`: one clear line for bad input; a real server process that serves a
run's state and streams its updates; beyond loopback, a token (0600) and nothing without it."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from grpo_stream.cli.main import app
from grpo_stream.rundir.outcome import write_outcome


def _run_dir(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "kl": 0.5}) + "\n")
    write_outcome(run_dir, "completed", 1)
    return run_dir


def _fails(args: list[str], line: str) -> None:
    result = CliRunner().invoke(app, ["dashboard", *args])
    assert result.exit_code == 2, result.output
    assert line in result.output


def test_it_needs_a_run_directory_or_a_hub(tmp_path: Path) -> None:
    _fails([], "give a run directory, or --hub tcp://HOST:PORT")
    _fails([str(tmp_path / "nowhere")], "is not a run directory")


def test_a_bad_option_is_named_with_its_setting(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    _fails([str(run_dir), "--port", "70000"], "--port (dashboard.port)")
    _fails([str(run_dir), "--poll", "0"], "--poll (dashboard.poll_s)")
    _fails([str(run_dir), "--host", "a b"], "--host (dashboard.host)")


def test_beyond_loopback_a_hub_alone_needs_a_token_file(tmp_path: Path) -> None:
    _fails(["--hub", "tcp://127.0.0.1:9", "--host", "0.0.0.0"], "give --token-file")
    short = tmp_path / "token"
    short.write_text("abc\n")
    _fails(
        ["--hub", "tcp://127.0.0.1:9", "--host", "0.0.0.0", "--token-file", str(short)],
        "shorter than 16 characters",
    )


class Served:
    """Starts `grpo-stream dashboard` processes; `stop` sends the last one SIGTERM."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen[bytes]] = []

    def __call__(self, *args: str) -> str:
        url_file = self.tmp_path / "url"
        argv = [sys.executable, "-m", "grpo_stream.cli.main", "dashboard", *args,
                "--url-file", str(url_file)]  # fmt: skip
        self.procs.append(subprocess.Popen(argv, stderr=subprocess.PIPE))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if url_file.exists() and url_file.read_text().strip():
                return url_file.read_text().strip()
            if self.procs[-1].poll() is not None:
                raise AssertionError(self.procs[-1].stderr.read().decode())  # type: ignore[union-attr]
            time.sleep(0.1)
        raise AssertionError("the dashboard did not write its address")

    def stop(self) -> None:
        self.procs[-1].terminate()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Served]:
    served = Served(tmp_path)
    yield served
    for proc in served.procs:
        proc.terminate()
        assert proc.wait(timeout=20) is not None


def test_a_server_process_serves_the_state_and_streams_updates(tmp_path: Path, serve) -> None:
    run_dir = _run_dir(tmp_path)
    url = serve(str(run_dir), "--port", "0", "--poll", "0.2")
    token = (run_dir / "dashboard.token").read_text().strip()
    assert url.startswith("http://127.0.0.1:") and url.endswith(f"/?token={token}")
    base, auth = url.split("?", 1)[0], {"authorization": f"Bearer {token}"}
    assert httpx.get(base + "api/state", timeout=10).status_code == 401  # a local stranger
    state = httpx.get(base + "api/state", headers=auth, timeout=10).json()
    assert state["run"]["phase"] == "completed" and state["files"]["metrics"][0]["step"] == 1
    events: list[tuple[str, dict]] = []
    with httpx.stream("GET", base + "api/events", headers=auth, timeout=10) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        name = ""
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((name, json.loads(line.removeprefix("data: "))))
                if len(events) == 1:  # a new step once the page has its snapshot
                    with (run_dir / "metrics.jsonl").open("a") as fh:
                        fh.write(json.dumps({"step": 2, "kl": 0.4}) + "\n")
                elif events[-1][1]["files"]["metrics"]:
                    break
    assert events[0][0] == "snapshot"
    name, update = events[-1]
    assert name == "update" and update["files"]["metrics"] == [{"step": 2, "kl": 0.4}]


def test_beyond_loopback_it_makes_a_private_token_and_refuses_requests_without_it(
    tmp_path: Path, serve
) -> None:
    run_dir = _run_dir(tmp_path)
    url = serve(str(run_dir), "--host", "0.0.0.0", "--port", "0")
    token_file = run_dir / "dashboard.token"
    token = token_file.read_text().strip()
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600 and len(token) >= 16
    assert url.endswith(f"/?token={token}")
    port = url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1]
    local = f"http://127.0.0.1:{port}"
    assert httpx.get(local + "/api/state", timeout=10).status_code == 401
    with_token = httpx.get(local + "/api/state", params={"token": token}, timeout=10)
    assert with_token.status_code == 200 and with_token.json()["run"]["phase"] == "completed"


def test_a_page_open_when_the_server_stops_gets_the_runs_end_then_its_stream_ends(
    tmp_path: Path, serve
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "kl": 0.5}) + "\n")
    url = serve(str(run_dir), "--port", "0", "--poll", "60")  # no poll but the last one
    base, token = url.split("?token=", 1)
    phases: list[str] = []
    with httpx.stream("GET", base + "api/events", params={"token": token}, timeout=20) as response:
        for line in response.iter_lines():  # ends when the server ends the stream
            if not line.startswith("data: "):
                continue
            phases.append(json.loads(line.removeprefix("data: "))["run"]["phase"])
            if len(phases) == 1:  # the run ends (`up` writes its outcome), then its server
                write_outcome(run_dir, "completed", 1)
                serve.stop()
    assert phases == ["waiting", "completed"]
