"""The generator as a service: build the engine (and the episode player) from the run's
config, serve the hub with a `Generator` until stopped; an engine that cannot go on ends it
with `EXIT_ENGINE_FAILED`.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from grpo_stream.agents.player import AgentPlayer
from grpo_stream.config import RunConfig
from grpo_stream.engines import Engine, make_engine
from grpo_stream.engines.hf import HFEngine
from grpo_stream.engines.inflight import InflightEngine
from grpo_stream.engines.streaming import EngineFailed
from grpo_stream.engines.vllm.engine import VLLMEngine
from grpo_stream.envs.service import EpisodePlayer, Player
from grpo_stream.exits import EXIT_ENGINE_FAILED
from grpo_stream.protocols import messages as m
from grpo_stream.services.generator import Generator
from grpo_stream.session.service import Join, Session, run_service

log = structlog.get_logger()


def run_generator(join: Join, throttle: float = 1.0, weights_noise: float = 0.0) -> int:
    return run_service(join, lambda session: serve_generator(session, throttle, weights_noise))


def serve_generator(session: Session, throttle: float = 1.0, weights_noise: float = 0.0) -> int:
    """Build the engine from the run's config, serve until stopped."""
    import torch

    cfg = session.cfg
    torch.manual_seed(cfg.run.seed)
    engine = make_engine(
        cfg.generator.engine,
        cfg.model,
        cfg.generator,
        cfg.transport,
        session.security,
        lora=cfg.trainer.lora,
        weights=cfg.weights,
        secret=session.secret,
    )
    log.info("generator.ready", engine=cfg.generator.engine, model=cfg.model.name_or_path)
    session.generator_stats = ready_stats(engine.version)  # the hub: loaded, no longer loading
    player = _player(cfg, engine, lambda: session.stop.set)
    try:
        generator = Generator(
            session, engine, throttle=max(throttle, cfg.generator.throttle), player=player,
            weights_noise=weights_noise,
        )  # fmt: skip
        if cfg.generator.inflight_updates and isinstance(engine, InflightEngine):
            keep_kv = cfg.generator.inflight_kv == "keep"
            engine.enable_inflight(generator.weights.between_steps, keep_kv)
        generator.serve()
    except EngineFailed as exc:
        log.error("generator.engine_failed", error=str(exc)[:500])
        session.farewell = "engine failed"
        return EXIT_ENGINE_FAILED
    finally:
        if player is not None:
            player.__exit__()
        engine.close()
    return 0


def ready_stats(version: int) -> m.GeneratorStats:
    """A generator's counters before its first batch: its heartbeats carry them from the
    moment its engine is built, so the hub tells a loading generator from a ready one."""
    return m.GeneratorStats(
        tokens_per_s=0.0, wait_s=0.0, version=version, batches=0, prompts_total=0, busy_s=0.0
    )


def _player(cfg: RunConfig, engine: Engine, stopping: Callable[[], bool]) -> Player | None:
    """The episode player of an episode run (env.name or env.agent set), started."""
    if not cfg.env.enabled:
        return None
    if not isinstance(engine, HFEngine | VLLMEngine):  # both have complete and tokenizer
        raise ValueError("env.name and env.agent need generator.engine = 'hf' or 'vllm'")
    if cfg.env.agent is not None:
        agents = AgentPlayer(cfg.env, engine, engine.tokenizer, cfg.model.name_or_path, stopping)
        return agents.__enter__()
    player = EpisodePlayer(cfg.env, engine, engine.tokenizer, cfg.task.chat_template)
    return player.__enter__()
