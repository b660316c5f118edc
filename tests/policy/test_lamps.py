"""LAMPS: strategy chosen before the call, memory-time ranking, starvation promotion."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from interlude.policy import Handling, KVAction, Phase, Profile, SchedulerView, make_policy, rekeyed
from interlude.policy.area import choose_strategy, memory_time_area
from interlude.policy.lamps import LampsPolicy, LampsPredictedPolicy


def test_choose_strategy_is_the_argmin(make_profile: Callable[..., Profile]) -> None:
    p = make_profile()
    # C = 160, C_other = 3000, 10 running tokens (chunk 246, n = 1), T_fwd(160) = 18 ms:
    #   discard  = 0.018 x 160 x 1000 / 2 + 0.018 x 3000 x 1000 = 55,440
    #   sync swap = 2 x T_swap(160) x (3000 + 160) x 1000 = 2 x 0.016 x 3,160,000 = 101,120
    # preserve 0.01 s x 160 x 1000 = 1,600 -> preserve; 10 s -> 1,600,000 -> discard.
    assert choose_strategy(p, 160, 0.01, 3000, 10) is Handling.PRESERVE
    assert choose_strategy(p, 160, 10.0, 3000, 10) is Handling.DISCARD
    # 100x the bandwidth: sync swap = 2 x 0.00016 x 3,160,000 = 1,011.2 < 55,440 -> swap.
    fast = make_profile(swap_bandwidth_bps=1e9)
    assert choose_strategy(fast, 160, 10.0, 3000, 10) is Handling.SWAP


def test_memory_time_area(make_profile: Callable[..., Profile]) -> None:
    p = make_profile()
    # Decoding 100 tokens from 160 at 10 ms/token: (160 x 100 + 100^2 / 2) x 0.01 = 210
    decode = 210.0
    assert memory_time_area(p, 160, 100, 2.0, Handling.PRESERVE, 0.01) == pytest.approx(
        decode + 260 * 2.0  # the whole 260-token context held for the 2 s call
    )
    # Discard: a recompute spike of 260 tokens for T_fwd(260)/2 = 23 ms / 2.
    assert memory_time_area(p, 160, 100, 2.0, Handling.DISCARD, 0.01) == pytest.approx(
        decode + 260 * 0.023 / 2
    )
    # Swap: held for the copy out and back, 2 x T_swap(260) = 2 x 0.026 s.
    assert memory_time_area(p, 160, 100, 2.0, Handling.SWAP, 0.01) == pytest.approx(
        decode + 260 * 2 * 0.026
    )


def test_queue_key_hand_computed(
    make_profile: Callable[..., Profile], fake_request: Callable[..., Any]
) -> None:
    lamps = LampsPolicy(make_profile())
    r = fake_request("r", pending=160)
    # Priors: 100 tokens before the call, a 1 s call; no batch seen yet (C_other = 0, 0 running
    # tokens, so a token costs T_fwd(1) = 10.05 ms). At the call C = 160 + 100 = 260:
    #   preserve 1 x 260 x 1000 = 260,000; sync swap 2 x 0.026 x 260 x 1000 = 13,520;
    #   discard: 2 chunks of <= 256, (0.013 + 0.01) x 260 / 2 x 1000 + 0 = 2,990 -> discard.
    # Area: (160 x 100 + 100^2 / 2) x 0.01005 = 211.05, plus 260 x T_fwd(260) / 2 = 2.99.
    key = lamps.queue_key(r, 0.0)
    assert key[0] == 0.0
    assert key[1] == pytest.approx(214.04)
    assert lamps.rank_strategy(r) is Handling.DISCARD


def test_short_light_work_ranks_first(
    make_profile: Callable[..., Profile], fake_request: Callable[..., Any]
) -> None:
    lamps = LampsPolicy(make_profile())
    small = fake_request("small", arrival=5.0, pending=50)
    big = fake_request("big", arrival=0.0, pending=2000)
    assert lamps.queue_key(small, 5.0) < lamps.queue_key(big, 5.0)


def test_starving_request_is_promoted_ahead_of_everyone(
    make_profile: Callable[..., Profile],
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    lamps = LampsPolicy(make_profile())
    # Ran once (admitted, then preempted or resumed), back in the queue at iteration 5.
    hungry = fake_request("hungry", pending=3000, queue_iteration=5, scheduled_once=True)
    tiny = fake_request("tiny", pending=1, queue_iteration=5)
    k_hungry, k_tiny = lamps.queue_key(hungry, 1.0), lamps.queue_key(tiny, 1.0)
    assert k_tiny < k_hungry  # a 3000-token context ranks behind a 1-token one

    d = lamps.decide(make_view(iteration=104, waiting=[tiny, hungry]))
    assert d.requeue == ()  # 99 iterations of waiting
    assert d.review_iteration == 105  # the engine must not skip past the promotion
    d = lamps.decide(make_view(iteration=105, waiting=[tiny, hungry]))
    assert d.requeue == ("hungry",)

    promoted = lamps.queue_key(hungry, 2.0)
    assert promoted == (-1.0, 1.0)
    assert promoted < lamps.queue_key(tiny, 2.0)
    assert promoted < (0.0, 0.0)  # below any area-ranked key

    lamps.on_finish(hungry, 3.0)  # forgotten once it finishes
    assert lamps.queue_key(hungry, 3.0)[0] == 0.0


def test_never_scheduled_request_is_never_promoted(
    make_profile: Callable[..., Profile],
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    lamps = LampsPolicy(make_profile())
    fresh = fake_request("fresh", pending=3000, queue_iteration=0)
    lamps.queue_key(fresh, 0.0)
    d = lamps.decide(make_view(iteration=1000, waiting=[fresh]))
    assert d.requeue == () and d.review_iteration is None


def _paused(fake_request: Callable[..., Any], rid: str, kind: str) -> Any:
    return fake_request(rid, phase=Phase.PAUSED, kind=kind, gpu=160, paused_at=0.0)


def test_decide_applies_the_chosen_strategy(
    make_profile: Callable[..., Profile],
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    lamps = LampsPolicy(make_profile())
    lamps.predictor.observe_duration("chat", 30.0)
    lamps.predictor.observe_duration("calc", 0.001)
    chat, calc = _paused(fake_request, "chat", "chat"), _paused(fake_request, "calc", "calc")
    # At C = 160 + 100 predicted = 260, no batch: discard 2,990, swap 13,520 (see above);
    # chat preserve 30 x 260,000 = 7.8e6 -> discard; calc 0.001 x 260,000 = 260 -> preserve.
    d = lamps.decide(make_view(now=0.5, paused=[chat, calc]))
    assert d.kv == (KVAction("chat", Handling.DISCARD, 10),)


def test_swap_strategy_within_budget_or_discard_when_host_full(
    make_profile: Callable[..., Profile],
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    p = make_profile(swap_bandwidth_bps=1e9)
    # Sync swap of 260 tokens: 2 x 0.00026 s x 260 x 1000 = 135.2 < discard 2,990 < preserve.
    chat = _paused(fake_request, "chat", "chat")
    lamps = LampsPolicy(p)
    lamps.predictor.observe_duration("chat", 30.0)
    d = lamps.decide(make_view(profile=p, now=0.5, paused=[chat], swap_budget_tokens=32))
    assert d.kv == (KVAction("chat", Handling.SWAP, 2),)  # 32 tokens = 2 blocks this iteration
    full = make_view(profile=p, now=0.5, paused=[chat], free_cpu_blocks=0)
    assert lamps.decide(full).kv == (KVAction("chat", Handling.DISCARD, 10),)


def test_queue_key_uses_the_true_lengths_when_the_view_has_them(
    make_profile: Callable[..., Profile], fake_request: Callable[..., Any]
) -> None:
    p = make_profile()
    r = fake_request("r", pending=160, oracle_gen=40, oracle_call_s=2.0)
    # The truth: 40 tokens before a 2 s call, so C = 200 at the call. No batch seen yet.
    #   preserve 2 x 200 x 1000 = 400,000; sync swap 2 x 0.02 x 200 x 1000 = 8,000;
    #   discard T_fwd(200) x 200 x 1000 / 2 = 0.02 x 100,000 = 2,000 -> discard.
    # Area: (160 x 40 + 40^2 / 2) x T_fwd(1) = 7,200 x 0.01005 = 72.36, plus 200 x 0.02 / 2.
    lamps = LampsPolicy(p)
    assert lamps.queue_key(r, 0.0) == pytest.approx((0.0, 72.36 + 2.0))
    assert lamps.rank_strategy(r) is Handling.DISCARD
    # The last segment (no call after it): nothing to preserve, the area is the decode alone.
    last = fake_request("last", pending=160, oracle_gen=40, oracle_call_s=0.0)
    assert lamps.queue_key(last, 0.0) == pytest.approx((0.0, 72.36))
    assert lamps.rank_strategy(last) is Handling.PRESERVE
    # lamps-predicted ignores the truth: the priors (100 tokens, 1 s) give 214.04 as above.
    predicted = make_policy("lamps-predicted", p)
    assert isinstance(predicted, LampsPredictedPolicy)
    assert predicted.queue_key(r, 0.0) == pytest.approx((0.0, 214.04))


def test_strategy_follows_the_batch_while_waiting_and_holds_once_run(
    make_profile: Callable[..., Profile],
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    """Re-scored at every iteration (the engine asks the key again), the strategy is chosen
    from the batch of that iteration; the one applied at the pause is the last one chosen.

    At the call: C = 160 + 100 = 260 tokens, a 0.05 s call: preserve 0.05 x 260 x 1000 =
    13,000. Alone: chunked discard 0.023 x 260 x 1000 / 2 = 2,990 -> discard. Beside a
    3000-token runner: 2,990 + a x 260 x 3000 x 1000 = 41,990, sync swap 2 x 0.026 x 3,260 x
    1000 = 169,520 -> preserve.
    """
    lamps = LampsPolicy(make_profile())
    assert lamps.traits.rescore_queued
    r = fake_request("r", pending=160, oracle_gen=100, oracle_call_s=0.05)
    lamps.decide(make_view(iteration=1))
    lamps.queue_key(r, 0.0)
    assert lamps.rank_strategy(r) is Handling.DISCARD
    runner = fake_request("runner", phase=Phase.RUNNING, gpu=3000)
    lamps.decide(make_view(iteration=2, running=[runner], waiting=[r]))
    lamps.queue_key(r, 0.1)
    assert lamps.rank_strategy(r) is Handling.PRESERVE
    # r is admitted, generates its 100 tokens and pauses when the runner has left: chosen
    # afresh the strategy would be discard again, but the one chosen before it ran stands.
    r.phase, r.pending_tokens, r.gpu_tokens = Phase.PAUSED, 0, 260
    r.context_tokens, r.generated_tokens, r.paused_at = 260, 100, 1.0
    assert lamps.decide(make_view(iteration=30, now=1.0, paused=[r])).kv == ()
    fresh = LampsPolicy(make_profile())
    discard = KVAction("r", Handling.DISCARD, 17)
    assert fresh.decide(make_view(iteration=30, now=1.0, paused=[r])).kv == (discard,)


def test_fast_queue_key_equals_the_equations(
    make_profile: Callable[..., Profile],
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    """`LampsPolicy.queue_key` caches per-entry terms; it must give exactly the key and the
    strategy of `choose_strategy` + `memory_time_area`, from the batch last observed."""
    fast_swap = make_profile(swap_bandwidth_bps=3e8)
    for p in (make_profile(), fast_swap):
        fast = LampsPolicy(p)
        reqs = [
            fake_request(f"r{i}", pending=pending, generated=gen, oracle_gen=truth, oracle_call_s=d)
            for i, (pending, gen, truth, d) in enumerate(
                [(160, 0, 40, 2.0), (900, 3, 10, 0.02), (50, 0, 400, 30.0), (3000, 0, 1, 0.0)]
            )
        ]
        seen = set()
        for iteration, context in enumerate((0, 500, 3000, 60_000)):
            runner = fake_request("run", phase=Phase.RUNNING, gpu=max(1, context))
            view = make_view(iteration=iteration, running=[runner] if context else [])
            fast.decide(view)
            t_tok = p.t_fwd(max(view.running_tokens, 1))
            for r in reqs:
                key = fast.queue_key(r, 0.0)
                gen = fast.tokens_ahead(r)
                s = choose_strategy(
                    p,
                    r.context_tokens + gen,
                    r.oracle_call_s,
                    view.running_context,
                    view.running_tokens,
                )
                area = memory_time_area(p, r.context_tokens, gen, r.oracle_call_s, s, t_tok)
                assert key == (0.0, area), (p.name, context)
                assert fast.rank_strategy(r) is s
                seen.add(s)
        assert len(seen) >= 2  # the grid really moves the choice


def test_array_keys_equal_the_loop(
    make_profile: Callable[..., Profile],
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Long queues are keyed on arrays (`KeyTable.keys`), short ones one by one: both give the
    same keys and choose the same strategies, promoted requests and new entries included."""
    import random

    rng = random.Random(5)
    for p in (make_profile(), make_profile(swap_bandwidth_bps=3e8)):
        arrays, loop = LampsPolicy(p), LampsPolicy(p)
        reqs = [
            fake_request(
                f"r{i}",
                pending=rng.randrange(1, 4000),
                generated=rng.randrange(0, 5),
                oracle_gen=rng.randrange(5, 500),
                oracle_call_s=rng.choice((0.0, 0.02, 2.0, 30.0)),
            )
            for i in range(60)
        ]
        for r in reqs:
            r.scheduled_once = True
        for iteration, context in enumerate((0, 500, 3000, 60_000, 200)):
            runner = fake_request("run", phase=Phase.RUNNING, gpu=max(1, context))
            view = make_view(iteration=iteration * 150, running=[runner] if context else [])
            if iteration == 3:  # a new entry for some: their terms are worked out again
                for r in reqs[::7]:
                    r.queue_time += 1.0
            for policy, first in ((arrays, 0), (loop, 10**9)):
                monkeypatch.setattr(rekeyed, "ARRAY_KEYS_FROM", first)
                policy.decide(view)
            monkeypatch.setattr(rekeyed, "ARRAY_KEYS_FROM", 0)
            got = arrays.queue_keys(reqs, 0.0)
            monkeypatch.setattr(rekeyed, "ARRAY_KEYS_FROM", 10**9)
            want = loop.queue_keys(reqs, 0.0)
            assert got == want, (p.name, context)
            assert [arrays.rank_strategy(r) for r in reqs] == [loop.rank_strategy(r) for r in reqs]
        assert any(k[0] < 0 for k in got)  # starvation promoted some along the way


def test_key_table_grows_for_a_new_row_in_any_write() -> None:
    """Rows past the table's size grow it, whichever write asks first (a promotion of a
    request never entered once indexed the array from before the growth)."""
    from interlude.policy.lamps_keys import PROMOTED, KeyTable

    table = KeyTable(rows=2)
    table.promote("a", 1)
    table.promote("b", 2)
    table.promote("c", 3)  # the third row: the table grows here
    assert [table.terms[PROMOTED, table.row[r]] for r in "abc"] == [1.0, 2.0, 3.0]
