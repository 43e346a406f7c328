"""Under hub.payloads = "direct" the scorer checks what it fetches as the hub checks what it
carries: a payload whose texts are not its ids is refused (PayloadLost, code "refused") and
never scored; an honest one becomes the ScoreRequest. Real payload store and fetcher."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo_stream.config import config_from_dict
from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.hub.content import ContentCheck
from grpo_stream.hub.payloads.store import PayloadFetcher, PayloadServer, PayloadStore
from grpo_stream.protocols import messages as m
from grpo_stream.protocols.payloads import PayloadLost, ScoreRef
from grpo_stream.services.scorer import _fetched
from grpo_stream.tasks import make_task
from grpo_stream.transport.sockets import Context, close_context, make_context

sys.path.insert(0, str(Path(__file__).parents[1] / "hub"))
from test_content import honest

SETTINGS = TransportSettings(io_timeout_ms=2000)


class Hub:
    """What the scorer told the hub."""

    def __init__(self) -> None:
        self.sent: list[m.Message] = []
        self.credits = 0

    def send(self, msg: m.Message) -> None:
        self.sent.append(msg)

    def replenish(self, credits: int) -> None:
        self.credits += credits


@pytest.fixture
def ctx() -> Iterator[Context]:
    context = make_context()
    yield context
    close_context(context)


def test_the_scorer_scores_only_texts_that_are_the_ids(ctx: Context, tmp_path: Path) -> None:
    cfg = config_from_dict({"run": {"run_dir": str(tmp_path)}})
    check = ContentCheck.load(cfg, make_task(cfg.task))
    good, bad = honest(check, cfg, gid=3), honest(check, cfg, gid=4)
    bad.texts = ["the right answer"] * len(bad.texts)
    store = PayloadStore(8)
    digests = {r.group_id: store.put(r) for r in (good, bad)}
    server = PayloadServer(ctx, "tcp://127.0.0.1:0", SETTINGS, SecuritySettings(), store)
    fetcher = PayloadFetcher(ctx, SETTINGS, SecuritySettings(), "scorer", timeout_s=5.0)
    hub = Hub()
    try:
        refs = {gid: ScoreRef(lease_id=1, group_id=gid, prompt=check.task.problem(gid).prompt,
                              reference={}, source=server.address, digest=d)
                for gid, d in digests.items()}  # fmt: skip
        request = _fetched(fetcher, refs[3], 2, hub, check)
        assert isinstance(request, m.ScoreRequest) and request.completions == good.texts
        assert _fetched(fetcher, refs[4], 2, hub, check) is None
    finally:
        fetcher.close()
        server.close()
    (lost,) = hub.sent
    assert isinstance(lost, PayloadLost) and lost.codes == ["refused"] and lost.group_ids == [4]
    assert "not the decoding" in lost.reason and hub.credits == 1
