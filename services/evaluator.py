"""The evaluator service: follow the trainer's weights, evaluate every `eval.every` versions.

A dedicated process with its own hf engine (not a generator's idle slots), so evaluation
never delays the trainer nor takes prompts from the hub: it joins the hub only for the run's
config and the trainer's addresses, listens to the weight announcements, and applies a version
with the engine's public `update_from_server` when one is due. It evaluates the initial
weights first (version 0), then the first version at or past each multiple of `eval.every`;
a version published while it evaluates is not queued (the next due one is taken instead).
"""

from __future__ import annotations

import structlog

from grpo_stream.agents.player import AgentPlayer
from grpo_stream.engines.hf import HFEngine
from grpo_stream.evaluator.online import OnlineEval
from grpo_stream.session.service import Join, Session, run_service
from grpo_stream.transport.fetch import WeightsWatcher

log = structlog.get_logger()


def next_due(version: int, every: int) -> int:
    """The first version after `version` that is a multiple of `every`."""
    return (version // every + 1) * every


class Announcements:
    """The trainer's weight announcements, followed across trainer restarts (a Welcome with
    a new announce address re-subscribes)."""

    def __init__(self, link: Session) -> None:
        self.link = link
        self.watcher: WeightsWatcher | None = None
        self.watched: str | None = None
        self.late = False

    def poll(self) -> int | None:
        """The latest announced version so far (None: none yet)."""
        peers = self.link.peers
        address = None if peers is None else peers.announce
        if address is not None and address != self.watched:
            if self.watcher is not None:
                self.watcher.close()
            cfg = self.link.cfg
            self.watcher = WeightsWatcher(self.link.ctx, address, cfg.transport, self.link.security)
            self.watched = address
            self.late = True
        return self.watcher.poll(0) if self.watcher is not None else None

    def take_late(self) -> bool:
        """True once after each new subscription: announcements sent before it are lost."""
        late, self.late = self.late, False
        return late

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.close()


def serve_evaluator(link: Session) -> int:
    cfg = link.cfg
    stop = link.stop
    if cfg.eval.every == 0:  # started by hand on a run that does not evaluate
        log.warning("eval.off", reason="eval.every = 0: nothing to evaluate")
        while not stop.set:
            link.recv(timeout_ms=200)
        return 0
    follow = Announcements(link)
    follow.poll()  # subscribe before the first evaluation: a fast trainer announces meanwhile
    engine = HFEngine.from_settings(  # its fetches carry the run's secret: weights go to members
        cfg.model, cfg.transport, link.security, cfg.eval.device, secret=link.secret
    )
    online = OnlineEval.build(cfg, engine.tokenizer)
    agents = None
    if cfg.env.agent is not None:  # an agent run is evaluated through the agent's endpoint
        agents = AgentPlayer(
            cfg.env, engine, engine.tokenizer, cfg.model.name_or_path, lambda: stop.set
        ).__enter__()
    try:
        online.run(engine, step=engine.version, agents=agents)
        due = next_due(engine.version, cfg.eval.every)
        while not stop.set:
            link.recv(timeout_ms=50)  # Welcome (new trainer addresses), Shutdown
            announced = follow.poll()
            peers = link.peers
            if peers is None:
                continue
            # subscribed after the trainer announced (a Welcome naming it came late): what it
            # announced before is lost to us, so ask its server once for the newest version
            late = announced is None and follow.take_late()
            if not late and (announced is None or announced < due):
                continue
            version = engine.update_from_server(peers.weights, -1)
            if version >= due:
                online.run(engine, step=version, agents=agents)
                due = next_due(version, cfg.eval.every)
            link.stats.update(evaluated_version=version)
    finally:
        follow.close()
        online.close()
        if agents is not None:
            agents.__exit__()
        engine.close()
    return 0


def run_evaluator(join: Join) -> int:
    return run_service(join, serve_evaluator)
