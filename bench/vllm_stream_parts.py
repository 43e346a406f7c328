"""The pieces of bench.vllm_stream: the long-tailed model, a dispatching hub, the batch-side
engine (the synchronous `vllm.LLM` path the vllm engine had before it streamed) and the
stand-in trainer of the in-flight part.

- `build_model`: a random 2-layer Qwen2 (hidden 64, head_dim 64 as vLLM's CPU backend needs,
  512 positions) on the tiny model's tokenizer, with an untied lm_head whose end-of-sequence
  row is 1.75 x a random unit vector: the chance to stop varies with every step's hidden
  state, so completion lengths are long-tailed (measured with the hf engine, 128 samples at
  temperature 1: p50 44, p90 126, p99 196, max 201 of 256). The bench prints the lengths it
  actually got.
- `BenchHub`: a real ROUTER that says Welcome like the hub, answers credits with PromptBatches
  of at most a lease's prompts (`lease_base`: a step's, as the hub's dispatch leases them), and
  records the credits asked for, when each group was dispatched and when its Rollout arrived,
  and what it carried.
- `BatchLLM`: `vllm.LLM.generate` on a whole PromptBatch, what `generator.engine = "vllm"` ran
  before (one blocking call per batch; every group of it reaches the hub together).
"""

from __future__ import annotations

import argparse
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import TINY_MODEL
from grpo_stream.config import RunConfig, config_from_dict
from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.engines.streaming import group_seed
from grpo_stream.hub.dispatch import lease_base
from grpo_stream.protocols import messages as m
from grpo_stream.sampling import Completion, GroupSample, Sampling
from grpo_stream.transport.sockets import Server, close_context, make_context

EOS_SCALE = 1.75


def build_model(out: Path, seed: int = 0) -> str:
    """Write the bench's long-tailed model (see module docstring); returns its directory."""
    import torch

    from grpo_stream.models.loading import load_tokenizer
    from grpo_stream.models.testing import tiny_qwen2

    tok = load_tokenizer(TINY_MODEL)
    eos = tok.eos_token_id
    model = tiny_qwen2(len(tok), seed, hidden=64, intermediate=128, layers=2, heads=1,
                       kv_heads=1, head_dim=64, positions=512, tie=False, eos_token_id=eos,
                       pad_token_id=tok.pad_token_id, bos_token_id=None)  # fmt: skip
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0, 1.0)
        model.lm_head.weight.normal_(0, 0.02)
        direction = torch.randn(64, generator=torch.Generator().manual_seed(seed + 1))
        model.lm_head.weight[eos] = EOS_SCALE * direction / direction.norm()
    model.generation_config.eos_token_id = eos
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def workload(count: int) -> list[str]:
    return [f"{a}+{b}=" for a, b in zip(range(count), range(7, 7 + count), strict=True)]


@dataclass
class Record:
    """What the hub saw of one side's run."""

    dispatched: dict[int, float] = field(default_factory=dict)  # group id -> when sent
    arrived: dict[int, float] = field(default_factory=dict)  # group id -> Rollout received
    rollouts: dict[int, m.Rollout] = field(default_factory=dict)
    credits_asked: int = 0  # by the generator, in all

    def tokens(self) -> int:
        return sum(len(r.completion_ids) for r in self.rollouts.values())

    def latencies(self) -> list[float]:
        return sorted(self.arrived[g] - self.dispatched[g] for g in self.arrived)

    def seconds(self) -> float:
        return max(self.arrived.values()) - min(self.dispatched.values())


class BenchHub:
    """Welcome, credits and PromptBatches over a real ROUTER; records every group."""

    def __init__(self, cfg: RunConfig, prompts: list[str], peers: m.Endpoints | None) -> None:
        self.cfg = cfg
        self.prompts = prompts
        self.peers = peers
        self.record = Record()
        self.done = threading.Event()
        self.on_rollout: queue.Queue[m.Rollout] = queue.Queue()  # for a stand-in trainer
        self.min_version = 0  # what PromptBatches ask for (the trainer thread raises it)
        self._ctx = make_context()
        self._server = Server(self._ctx, "tcp://127.0.0.1:0", TransportSettings(),
                              SecuritySettings(), "hub")  # fmt: skip
        self.address = self._server.address
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-hub", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        credits, cursor, lease, peer = 0, 0, 0, b""
        batch = lease_base(self.cfg)
        while not self._stop.is_set():
            got = self._server.recv(2)
            if got is not None:
                identity, msg = got
                if isinstance(msg, m.Hello):
                    peer = identity
                    self._server.send(identity, m.Welcome(
                        run_id="bench", config=self.cfg.model_dump(mode="json"),
                        config_digest=self.cfg.digest(), peers=self.peers,
                        policy_version=0))  # fmt: skip
                elif isinstance(msg, m.WorkRequest):
                    credits += msg.credits
                    self.record.credits_asked += msg.credits
                elif isinstance(msg, m.Rollout):
                    self.record.arrived[msg.group_id] = time.perf_counter()
                    self.record.rollouts[msg.group_id] = msg
                    self.on_rollout.put(msg)
                    if len(self.record.arrived) == len(self.prompts):
                        self.done.set()
            while credits > 0 and cursor < len(self.prompts):
                count = min(credits, batch, len(self.prompts) - cursor)
                lease += 1
                self._send_batch(peer, lease, list(range(cursor, cursor + count)))
                credits, cursor = credits - count, cursor + count

    def _send_batch(self, peer: bytes, lease: int, gids: list[int]) -> None:
        g = self.cfg.generator
        now = time.perf_counter()
        for gid in gids:
            self.record.dispatched[gid] = now
        self._server.send(peer, m.PromptBatch(
            lease_id=lease, group_ids=np.array(gids, np.int64),
            prompts=[self.prompts[i] for i in gids], references=[{} for _ in gids],
            group_size=g.group_size, min_version=self.min_version,
            sampling=m.SamplingParams(temperature=g.temperature, top_p=g.top_p,
                                      max_tokens=g.max_tokens),
        ))  # fmt: skip

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._server.close()
        close_context(self._ctx)


class BatchLLM:
    """The batch side: `vllm.LLM.generate` over a whole PromptBatch (the old vllm engine).
    Each prompt's request seed is its group's (`group_seed`, looked up by prompt), as the
    streaming side seeds it, so both sides sample the same completions."""

    def __init__(self, llm: Any, tokenizer: Any, seeds_by_prompt: dict[str, int]) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.seeds_by_prompt = seeds_by_prompt

    @property
    def version(self) -> int:
        return 0

    def generate(
        self, prompts: list[str], group_size: int, sampling: Sampling
    ) -> list[GroupSample]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        rows = self.tokenizer(prompts)["input_ids"]
        params = [SamplingParams(n=group_size, max_tokens=sampling.max_tokens,
                                 temperature=sampling.temperature, top_p=sampling.top_p,
                                 logprobs=0, detokenize=False,
                                 seed=self.seeds_by_prompt[p]) for p in prompts]  # fmt: skip
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=r) for r in rows], params,
                                 use_tqdm=False)  # fmt: skip
        return [GroupSample([int(t) for t in o.prompt_token_ids],
                            [self._completion(c) for c in o.outputs]) for o in outs]  # fmt: skip

    def _completion(self, comp: Any) -> Completion:
        ids = [int(t) for t in comp.token_ids]
        return Completion(
            token_ids=ids,
            logprobs=[float(pos[t].logprob) for t, pos in zip(ids, comp.logprobs, strict=True)],
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            truncated=comp.finish_reason == "length",
        )

    def load_weights(self, named: Any, version: int) -> None:
        raise NotImplementedError("the batch side takes no weights in this bench")

    def update_from_server(self, address: str, version: int) -> int:
        raise NotImplementedError("the batch side takes no weights in this bench")

    def close(self) -> None:
        """The bench shuts the LLM down."""


def run_config(
    args: argparse.Namespace, run_dir: Path, inflight: bool = False, credits: int | None = None
) -> RunConfig:
    """The generator's run: vllm, the workload's G and length; its credits `credits`, else
    --prompts-per-request, else (unset) the engine's capacity (services.credits)."""
    return config_from_dict({
        "run": {"run_dir": str(run_dir), "seed": 0},
        "generator": {"engine": "vllm", "group_size": args.group_size,
                      "max_tokens": args.max_tokens, "inflight_updates": inflight,
                      "prompts_per_request": credits or args.prompts_per_request},
        "trainer": {"micro_batch_tokens": 4 * (args.max_tokens + 64)},
        "transport": {"heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 10.0},
    })  # fmt: skip


def serve(cfg: RunConfig, engine: Any, prompts: list[str], peers: m.Endpoints | None,
          during: Callable[[BenchHub], None] | None = None) -> BenchHub:  # fmt: skip
    """Our generator on `engine` against a BenchHub until every prompt's group arrived."""
    from grpo_stream.services.generator import Generator
    from grpo_stream.session.service import Join, Session, StopFlag

    hub = BenchHub(cfg, prompts, peers)
    stop = StopFlag()
    errors: list[BaseException] = []

    def run() -> None:
        session = Session(Join("generator", "gen-0", hub.address, SecuritySettings()), stop)
        session.connect()
        try:
            Generator(session, engine).serve()
        except BaseException as exc:
            errors.append(exc)
        finally:
            session.close("done")

    thread = threading.Thread(target=run, name="bench-generator", daemon=True)
    thread.start()
    if during is not None:
        during(hub)
    hub.done.wait(3600)
    stop.stop("bench")
    thread.join(60)
    hub.close()
    if errors:
        raise errors[0]
    return hub


def seeds_by_prompt(prompts: list[str], run_seed: int) -> dict[str, int]:
    return {p: group_seed(run_seed, gid) for gid, p in enumerate(prompts)}
