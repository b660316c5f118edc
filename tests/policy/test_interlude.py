"""Our `interlude` policy on hand-built views.

Numbers (tiny profile, M = 1000 B): a paused request holds 160 tokens (10 blocks); one
running request holds C_other = 3000 tokens (1 running token). Then

    conversion cost  ChunkedDiscard(160) = 1,440 + 24,000 = 25,440   (see test_infercept)
    swap price       SyncSwap(160, 3000 + 160) = 2 x 0.016 s x 3,160 x 1000 = 101,120
    expected keep    remaining call time x 160 x 1000
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from interlude.policy import Handling, KVAction, Phase, Profile, SchedulerView, waste
from interlude.policy.area import choose_strategy, memory_time_area
from interlude.policy.interlude_config import InterludeConfig
from interlude.policy.interlude_policy import InterludePolicy
from interlude.policy.variants import Rekeyed

CONV = 25_440.0
SWAP_PRICE = 101_120.0


@pytest.fixture
def policy(make_profile: Callable[..., Profile], fake_request: Callable[..., Any]) -> Any:
    pol = InterludePolicy(make_profile())
    for kind, seconds in (("chat", 30.0), ("calc", 0.001), ("env", 0.2)):
        for _ in range(5):
            pol.on_resume(fake_request("old", kind=kind), 0.0, seconds)
    return pol


@pytest.fixture
def view_with(
    make_view: Callable[..., SchedulerView], fake_request: Callable[..., Any]
) -> Callable[..., SchedulerView]:
    """A view with the 3000-token runner; `pressure=True` adds a 64-token waiting request.

    Free blocks: 200 - 188 (runner: ceil(3000 / 16)) - 10 per paused request. Pressure: the
    runner may need 1 block, the waiting request ceil(64 / 16) = 4; 5 > free. Without
    pressure 40 are free: 80 % in use, past `swap_ahead_usage`, so swaps are priced as such.
    """

    def build(paused: list[Any], pressure: bool = False, **kwargs: Any) -> SchedulerView:
        runner = fake_request("runner", phase=Phase.RUNNING, gpu=3000)
        waiting = [fake_request("w", pending=64)] if pressure else []
        if not pressure:
            kwargs.setdefault("free_gpu_blocks", 40)
        return make_view(running=[runner], waiting=waiting, paused=paused, **kwargs)

    return build


def paused(fake_request: Callable[..., Any], rid: str, kind: str, at: float = 10.0) -> Any:
    return fake_request(rid, phase=Phase.PAUSED, kind=kind, gpu=160, paused_at=at)


def test_memory_pressure(
    policy: InterludePolicy,
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    running = [fake_request(f"r{i}", phase=Phase.RUNNING, gpu=17) for i in range(2)]
    waiting = [fake_request("w", pending=64)]
    # Want: 1 block per running request (2) + ceil(64 / 16) = 4 -> 6 blocks.
    assert policy.memory_pressure(make_view(running=running, waiting=waiting, free_gpu_blocks=5))
    assert not policy.memory_pressure(
        make_view(running=running, waiting=waiting, free_gpu_blocks=6)
    )
    # With 2 of its 4 blocks held by others already (a shared prefix), it asks for 2.
    shared = {"w": 2}
    assert not policy.memory_pressure(
        make_view(running=running, waiting=waiting, free_gpu_blocks=4, shared_blocks=shared)
    )
    assert policy.memory_pressure(
        make_view(running=running, waiting=waiting, free_gpu_blocks=3, shared_blocks=shared)
    )
    back = fake_request("back", phase=Phase.SWAP_QUEUED, cpu=17, pending=3)  # 2 blocks back
    assert policy.memory_pressure(
        make_view(running=running, waiting=waiting, swap_queue=[back], free_gpu_blocks=7)
    )


def test_long_kind_swapped_at_once_short_kind_kept(
    policy: InterludePolicy,
    view_with: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    chat = paused(fake_request, "chat", "chat")
    calc = paused(fake_request, "calc", "calc")
    # Just paused. chat: 30 s left -> keep 4,800,000 > swap price 101,120 -> swap (budget 160
    # tokens = 10 blocks). calc: 1 ms left -> keep 160: nothing to gain, stays on the GPU.
    view = view_with([calc, chat], now=10.0, swap_budget_tokens=160)
    assert policy.decide(view).kv == (KVAction("chat", Handling.SWAP, 10),)


def test_under_pressure_without_budget_long_kind_discarded_at_once(
    policy: InterludePolicy,
    view_with: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    chat = paused(fake_request, "chat", "chat")
    calc = paused(fake_request, "calc", "calc")
    view = view_with([chat, calc], pressure=True, now=10.0, free_cpu_blocks=0)
    assert policy.memory_pressure(view)
    d = policy.decide(view)
    # chat: keep 4,800,000 > conversion 25,440 -> discard now. calc: keep 160 and paid 0 are
    # below 25,440 -> kept, reviewed when the paid waste reaches it: 25,440 / 160,000 s later.
    assert d.kv == (KVAction("chat", Handling.DISCARD, 10),)
    assert d.review_at == pytest.approx(10.0 + CONV / 160_000)  # 10.159


def test_ski_rental_discards_despite_a_short_estimate(
    policy: InterludePolicy,
    view_with: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    env = paused(fake_request, "env", "env", at=10.0)  # env calls have taken 0.2 s
    # At 0.1 s: 0.1 s expected left, keep 16,000 and paid 16,000 < 25,440 -> keep, until the
    # paid waste reaches the conversion cost at 25,440 / 160,000 = 0.159 s.
    early = policy.decide(view_with([env], pressure=True, now=10.1, free_cpu_blocks=0))
    assert early.kv == ()
    assert early.review_at == pytest.approx(10.159)
    # At 0.18 s the estimate says 0.02 s (keep 3,200), but 28,800 is paid > 25,440.
    late = policy.decide(view_with([env], pressure=True, now=10.18, free_cpu_blocks=0))
    assert late.kv == (KVAction("env", Handling.DISCARD, 10),)


def test_no_discard_without_memory_pressure(
    policy: InterludePolicy,
    view_with: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    chat = paused(fake_request, "chat", "chat", at=0.0)
    env = paused(fake_request, "env", "env", at=0.0)
    # Paused 100 s: every preserve waste is far beyond the conversion cost, but nobody waits
    # for the memory. Without a swap budget: nothing at all.
    idle = view_with([chat, env], now=100.0, free_cpu_blocks=0)
    assert not idle.waiting and not policy.memory_pressure(idle)
    assert policy.decide(idle).kv == ()
    # With a 4-block budget: swaps only, and what does not fit stays.
    swap_only = policy.decide(view_with([chat, env], now=100.0, swap_budget_tokens=64))
    assert swap_only.kv
    assert all(a.handling is Handling.SWAP for a in swap_only.kv)
    assert sum(a.blocks for a in swap_only.kv) == 4


def test_swap_budget_respected(
    policy: InterludePolicy,
    view_with: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    reqs = [paused(fake_request, f"c{i}", "chat") for i in range(3)]
    back = fake_request("back", phase=Phase.SWAP_QUEUED, cpu=40, pending=5)
    view = view_with(reqs, swap_queue=[back], now=10.0, swap_budget_tokens=200)
    d = policy.decide(view)
    swapped = [a for a in d.kv if a.handling is Handling.SWAP]
    # (200 - 40 planned swap-in tokens) // 16 = 10 blocks: all to the first request by arrival
    # (equal expected waste, ties by arrival, then request order).
    assert sum(a.blocks for a in swapped) == 10


def test_preemption_takes_the_smallest_footprint(
    policy: InterludePolicy, fake_request: Callable[..., Any]
) -> None:
    reqs = [
        fake_request("big", phase=Phase.RUNNING, gpu=900, queue_time=3.0),
        fake_request("small", phase=Phase.RUNNING, gpu=40, queue_time=1.0),
        fake_request("mid", phase=Phase.RUNNING, gpu=300, queue_time=2.0),
    ]
    assert [r.request_id for r in policy.preemption_order(reqs)] == ["small", "mid", "big"]


def test_decision_that_changes_with_time_announces_its_review(
    policy: InterludePolicy,
    view_with: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    """`Decision.review_at` must be set when the decision can change without any event.

    A call of a kind never seen before: the remaining time falls back to the elapsed time,
    so the expected keep is 160,000 x elapsed and passes the swap price 101,120 at 0.632 s
    of elapsed time. Just after the pause nothing is swapped; a second later the same state
    is swapped. An engine that skips identical iterations (the simulator does) relies on
    `review_at` to stop at that point; without it the swap is delayed to the next event.
    """
    new = paused(fake_request, "new", "never-seen", at=10.0)
    first = policy.decide(view_with([new], now=10.0, swap_budget_tokens=160))
    assert first.kv == ()
    later = policy.decide(view_with([new], now=11.0, swap_budget_tokens=160))
    assert later.kv == (KVAction("new", Handling.SWAP, 10),)
    assert first.review_at is not None
    assert 10.0 < first.review_at <= 10.0 + SWAP_PRICE / 160_000 + 1e-9  # 10.632


def test_a_queued_key_is_priced_at_entry(
    make_profile: Callable[..., Profile],
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    """`interlude` keys a request once, as it enters its queue, by the area under the handling
    it expects (preserve or discard); engines do not ask again."""
    p = make_profile()
    pol = InterludePolicy(p)
    assert not pol.traits.rescore_queued
    r = fake_request("r", pending=160)  # priors: 100 tokens before a 1 s call
    for iteration, context in enumerate((0, 200_000)):
        runner = fake_request("run", phase=Phase.RUNNING, gpu=max(1, context))
        view = make_view(iteration=iteration, running=[runner] if context else [])
        pol.decide(view)
        keep = waste.preserve(p, 1.0, 260)
        conv = waste.chunked_discard(p, 260, view.running_context, view.running_tokens)
        strategy = Handling.PRESERVE if keep <= conv else Handling.DISCARD
        t_tok = p.t_fwd(max(view.running_tokens, 1))
        assert pol.queue_key(r, 0.0) == (0.0, memory_time_area(p, 160, 100, 1.0, strategy, t_tok))
        assert pol.rank_strategy(r) is strategy


def test_the_rekeyed_variant_follows_the_batch(
    make_profile: Callable[..., Profile],
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    """`variants.Rekeyed` keys a queued request again from each iteration's batch (LAMPS's
    discipline): its strategy and area change with the running context, without a new queue
    entry."""
    p = make_profile()
    pol = Rekeyed(p)
    assert pol.traits.rescore_queued  # engines ask again at every iteration
    r = fake_request("r", pending=160)
    seen = set()
    for iteration, context in enumerate((0, 200_000)):
        runner = fake_request("run", phase=Phase.RUNNING, gpu=max(1, context))
        view = make_view(iteration=iteration, running=[runner] if context else [])
        pol.decide(view)
        strategy = choose_strategy(p, 260, 1.0, view.running_context, view.running_tokens)
        t_tok = p.t_fwd(max(view.running_tokens, 1))
        assert pol.queue_key(r, 0.0) == (0.0, memory_time_area(p, 160, 100, 1.0, strategy, t_tok))
        assert pol.rank_strategy(r) is strategy
        seen.add(strategy)
    assert len(seen) == 2  # the batch really moved the choice


def test_promoted_requests_stay_ahead(
    make_profile: Callable[..., Profile],
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    pol = InterludePolicy(make_profile())
    starving = fake_request("s", pending=3000, queue_iteration=0, scheduled_once=True)
    tiny = fake_request("t", pending=1, queue_iteration=0)
    assert pol.queue_key(tiny, 0.0) < pol.queue_key(starving, 0.0)  # its wait starts counting
    d = pol.decide(make_view(iteration=pol.starvation.threshold, waiting=[tiny, starving]))
    assert d.requeue == ("s",)
    assert pol.queue_key(starving, 1.0) == (-1.0, 1.0)
    assert pol.queue_key(starving, 1.0) < pol.queue_key(tiny, 1.0)


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="headroom"):
        InterludeConfig(headroom=-0.1)


def test_decide_limits_admission_to_what_leaves_room_to_grow(
    policy: InterludePolicy,
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    """With no segment seen yet, the predictor's prior is 100 tokens: the runner (3,000
    tokens, 188 blocks) grows to 194 blocks, half of the 6 kept for it; a 64-token request
    needs 4 blocks and half of the 7 it grows to 11."""
    assert policy.predictor.segment_tokens("chat") == 100.0
    runner = fake_request("runner", phase=Phase.RUNNING, kind="chat", gpu=3000)
    waiting = [fake_request("w", pending=64)]
    # 12 free blocks: 12 - 3 >= 7.5, w may enter (no limit binds).
    assert policy.decide(make_view(running=[runner], waiting=waiting)).admit_limit is None
    # 9 free: 6 left after the reserve, w waits.
    tight = make_view(running=[runner], waiting=waiting, free_gpu_blocks=9)
    assert policy.decide(tight).admit_limit == 0
    # A runner past its predicted segment needs no reserve: 9 >= 7.5, w enters.
    done = fake_request("runner", phase=Phase.RUNNING, kind="chat", gpu=3000, generated=500)
    loose = make_view(running=[done], waiting=waiting, free_gpu_blocks=9)
    assert policy.decide(loose).admit_limit is None
