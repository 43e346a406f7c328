"""Dispatch by shares: each batch goes to the generator that would finish it first, never
beyond credits; over a run each generator's part follows its speed."""

from __future__ import annotations

from collections import Counter

from grpo_stream.config import config_from_dict
from grpo_stream.config.hardware import HardwareSettings
from grpo_stream.config.tasks import TaskSettings
from grpo_stream.hub.dispatch import Dispatcher, allocate, largest_lease, lease_base
from grpo_stream.hub.ledger import Ledger
from grpo_stream.hub.registry import Peer, Registry
from grpo_stream.hub.shares import ShareBook
from grpo_stream.protocols import messages as m
from grpo_stream.tasks import make_task

SHARES = {"fast": 0.75, "slow": 0.25}  # fast is 3x as fast


def peer(name: str, credits: int) -> Peer:
    return Peer("generator", name, name.encode(), "h", 1, 0, {}, credits=credits)


def test_idle_generators_get_work_fast_one_first() -> None:
    fast, slow = peer("fast", 8), peer("slow", 8)
    assert allocate([fast, slow], SHARES, Counter(), 4, batch=4) == {"fast": 4}
    # with more to give, the slow one gets a batch once the fast one's queue is long enough
    got = allocate([fast, slow], SHARES, Counter(), 12, batch=4)
    assert got == {"fast": 8, "slow": 4}


def test_a_slower_generator_waits_while_the_fast_one_would_finish_sooner() -> None:
    fast, slow = peer("fast", 0), peer("slow", 8)  # fast is full: it holds 8
    assert allocate([fast, slow], SHARES, Counter(fast=8), 4, batch=4) == {"slow": 4}
    fast, slow = peer("fast", 0), peer("slow", 4)  # slow already holds 4: 5/0.25 > 9/0.75
    assert allocate([fast, slow], SHARES, Counter(fast=8, slow=4), 4, batch=4) == {}


def test_never_more_than_credits_or_available() -> None:
    fast, slow = peer("fast", 3), peer("slow", 1)
    got = allocate([fast, slow], {"fast": 0.5, "slow": 0.5}, Counter(), 100, batch=4)
    assert got == {"fast": 3, "slow": 1}
    assert allocate([peer("a", 5)], {"a": 1.0}, Counter(), 0, batch=4) == {}


def test_a_generator_that_never_asked_for_work_is_not_waited_for() -> None:
    loading, ready = peer("loading", 0), peer("ready", 4)  # loading: no credits, holds nothing
    got = allocate([loading, ready], {"loading": 0.9, "ready": 0.1}, Counter(), 4, batch=4)
    assert got == {"ready": 4}


def test_an_unknown_device_with_share_zero_still_gets_work_when_alone() -> None:
    assert allocate([peer("a", 4)], {"a": 0.0}, Counter(), 4, batch=2) == {"a": 4}


def test_over_a_run_each_part_follows_the_speed() -> None:
    """Simulated time: each generator finishes prompts at its speed and asks again; the gate
    lets out up to 8 prompts per tick. The parts converge to the 3:1 speed ratio."""
    speed = {"fast": 3.0, "slow": 1.0}  # prompts per tick
    gens = {name: peer(name, 8) for name in speed}
    held: Counter[str] = Counter()
    sent: Counter[str] = Counter()
    progress = {name: 0.0 for name in speed}
    for _ in range(600):
        for name, n in allocate(list(gens.values()), SHARES, held, 8, batch=4).items():
            gens[name].credits -= n
            held[name] += n
            sent[name] += n
        for name, rate in speed.items():  # generate, return credits for finished prompts
            progress[name] = min(progress[name] + rate, float(held[name]))
            done = int(progress[name])
            progress[name] -= done
            held[name] -= done
            gens[name].credits += done
    assert abs(sent["fast"] / sent["slow"] - 3.0) < 0.3, sent


def test_with_a_thousand_generators_each_idle_one_gets_a_batch_fastest_first() -> None:
    """At fleet size the first to finish is still chosen: the 500 fastest idle generators
    get the 500 prompts, one each (a later, equally fast one loses the tie)."""
    gens = [peer(f"g{i}", 1) for i in range(1000)]
    shares = {f"g{i}": (2.0 if i % 2 else 1.0) for i in range(1000)}
    got = allocate(gens, shares, Counter(), 500, batch=1)
    assert got == {f"g{i}": 1 for i in range(1, 1000, 2)}


def test_a_lease_is_a_steps_prompts_unless_prompts_per_request_says_otherwise() -> None:
    assert lease_base(config_from_dict({"hub": {"groups_per_step": 12}})) == 12
    fixed = {"hub": {"groups_per_step": 12}, "generator": {"prompts_per_request": 5}}
    assert lease_base(config_from_dict(fixed)) == 5


def test_the_largest_lease_holds_a_step_whose_every_group_is_refilled_when_planned_ahead() -> None:
    ahead = {"hub": {"groups_per_step": 16, "max_refill_ratio": 1.5, "refill_ahead": True}}
    assert largest_lease(config_from_dict(ahead)) == 40  # 16 x (1 + 1.5)
    unfiltered = {**ahead, "algo": {"advantage": {"filter_zero_signal": False}}}
    assert largest_lease(config_from_dict(unfiltered)) == 16
    not_ahead = {"hub": {"groups_per_step": 16, "max_refill_ratio": 1.5, "refill_ahead": False}}
    assert largest_lease(config_from_dict(not_ahead)) == 16


def test_planned_ahead_a_lease_carries_a_steps_prompts_and_their_replacements() -> None:
    cfg = config_from_dict({"hub": {"groups_per_step": 16, "refill_ahead": True}})
    ledger = Ledger(16, 1, 10.0, max_refill_ratio=2.0, refill_ahead=True)
    for had_signal in [True, True, True, False]:  # a quarter of the groups without signal
        ledger.refill.observe(had_signal)
    registry = Registry(heartbeat_timeout_s=10.0)
    for name in ("a", "b"):  # equally fast: the leases split the gate's prompts
        registry.register(peer(name, 96), now=0.0)
    sent: list[m.PromptBatch] = []
    dispatcher = Dispatcher(
        cfg,
        ledger,
        registry,
        ShareBook(HardwareSettings()),
        make_task(TaskSettings()),
        lambda identity, msg: sent.append(msg) if isinstance(msg, m.PromptBatch) else None,
    )
    dispatcher.generators(now=0.0)
    # the gate lets out 32 slots / 0.75 = 42; a lease holds ceil(16 / 0.75) = 22 of them
    assert sorted(len(b.prompts) for b in sent) == [20, 22]
