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

from grpo_stream.session.service import Join, Session, run_service
from grpo_stream.transport.fetch import WeightsWatcher

log = structlog.get_logger()


def next_due(version: int, every: int) -> int:
    """The first version after `version` that is a multiple of `every`."""
    return (version // every + 1) * every


def serve_evaluator(link: Session) -> int:
    from grpo_stream.engines.hf import HFEngine
    from grpo_stream.evaluator.online import OnlineEval

    cfg = link.cfg
    stop = link.stop
    if cfg.eval.every == 0:  # started by hand on a run that does not evaluate
        log.warning("eval.off", reason="eval.every = 0: nothing to evaluate")
        while not stop.set:
            link.recv(timeout_ms=200)
        return 0
    engine = HFEngine.from_settings(cfg.model, cfg.transport, link.security, cfg.eval.device)
    online = OnlineEval.build(cfg, engine.tokenizer)
    watcher: WeightsWatcher | None = None
    watched: str | None = None
    try:
        online.run(engine, step=engine.version)
        due = next_due(engine.version, cfg.eval.every)
        while not stop.set:
            link.recv(timeout_ms=50)  # Welcome (new trainer addresses), Shutdown
            address = link.peers.get("announce")
            if address is not None and address != watched:
                if watcher is not None:
                    watcher.close()
                watcher = WeightsWatcher(link.ctx, address, cfg.transport, link.security)
                watched = address
            announced = watcher.poll(0) if watcher is not None else None
            if announced is None or announced < due or "weights" not in link.peers:
                continue
            version = engine.update_from_server(link.peers["weights"], -1)
            if version >= due:
                online.run(engine, step=version)
                due = next_due(version, cfg.eval.every)
            link.stats.update(evaluated_version=version)
    finally:
        if watcher is not None:
            watcher.close()
        online.close()
        engine.close()
    return 0


def run_evaluator(join: Join) -> int:
    return run_service(join, serve_evaluator)
