"""The dashboard's HTTP side through a real HTTP client (Starlette's TestClient over httpx):
the page and its assets (plotly.js from its package), the state, the token on every request
(loopback too: another local user is a stranger) and the Host check on loopback."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from grpo_stream.dashboard.feed import Feed
from grpo_stream.dashboard.server import COOKIE, create_app, is_loopback
from grpo_stream.dashboard.source import RunSource
from grpo_stream.rundir.outcome import write_outcome

TOKEN = "a-token-of-more-than-sixteen-characters"


def _feed(run_dir: Path) -> Feed:
    rows = [{"step": s, "reward_mean": 0.1 * s, "wall_time": float(s)} for s in range(1, 6)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_outcome(run_dir, "completed", 5)
    return Feed(RunSource(run_dir), poll_s=1.0)


@pytest.fixture
def local(tmp_path: Path) -> TestClient:
    client = TestClient(
        create_app(_feed(tmp_path), "127.0.0.1", TOKEN), base_url="http://127.0.0.1"
    )
    client.headers["authorization"] = f"Bearer {TOKEN}"
    return client


def test_on_loopback_too_every_request_needs_the_token(tmp_path: Path) -> None:
    """A local user without the token is a stranger: it gets none of the run's status
    (services, hosts, the hub's pid, counters)."""
    client = TestClient(
        create_app(_feed(tmp_path), "127.0.0.1", TOKEN), base_url="http://127.0.0.1"
    )
    for path in ("/", "/api/state", "/api/events", "/static/dashboard.js"):
        refused = client.get(path)
        assert refused.status_code == 401 and "hub_pid" not in refused.text, path
    assert client.get("/api/state", params={"token": TOKEN}).status_code == 200


def test_the_page_and_its_script_are_served(local: TestClient) -> None:
    page = local.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert '<svg id="graph"' in page.text and "/vendor/plotly.min.js" in page.text
    script = local.get("/static/dashboard.js")
    assert script.status_code == 200 and "EventSource" in script.text


def test_plotly_js_is_the_file_the_plotly_package_ships(local: TestClient) -> None:
    shipped = resources.files("plotly") / "package_data" / "plotly.min.js"
    served = local.get("/vendor/plotly.min.js")
    assert served.status_code == 200 and served.content == shipped.read_bytes()


def test_the_state_of_a_finished_run(local: TestClient) -> None:
    state = local.get("/api/state").json()
    assert state["run"]["phase"] == "completed"
    assert [r["step"] for r in state["files"]["metrics"]] == [1, 2, 3, 4, 5]
    assert {n["instance"] for n in state["graph"]["nodes"]} == {"grouper-0"}  # no logs


def test_on_loopback_a_request_for_another_host_is_refused(local: TestClient) -> None:
    assert local.get("/api/state", headers={"host": "attacker.example"}).status_code == 400
    assert local.get("/api/state", headers={"host": "localhost:8765"}).status_code == 200


def test_beyond_loopback_every_request_needs_the_token(tmp_path: Path) -> None:
    client = TestClient(create_app(_feed(tmp_path), "0.0.0.0", TOKEN), base_url="http://lan")
    for path in ("/", "/api/state", "/api/events", "/static/dashboard.js"):
        assert client.get(path).status_code == 401, path
    assert client.get("/api/state", params={"token": "wrong" * 5}).status_code == 401
    bearer = {"authorization": f"Bearer {TOKEN}"}
    assert client.get("/api/state", headers=bearer).status_code == 200
    page = client.get("/", params={"token": TOKEN})
    assert page.status_code == 200 and COOKIE in page.headers["set-cookie"]
    assert "httponly" in page.headers["set-cookie"].lower()
    assert client.get("/api/state").status_code == 200  # the cookie the page got


def test_an_app_with_a_short_token_is_not_made(tmp_path: Path) -> None:
    for host in ("127.0.0.1", "0.0.0.0"):
        with pytest.raises(ValueError, match="needs a token"):
            create_app(_feed(tmp_path), host, "short")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("localhost", True), ("::1", True),
     ("[::1]", True), ("0.0.0.0", False), ("192.168.1.4", False), ("gpu-node-3", False)],
)  # fmt: skip
def test_which_bind_hosts_are_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
