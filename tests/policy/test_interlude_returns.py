"""`interlude` keeps room for paused requests that will be back soon, and prices a swap under
pressure at the request's own memory (tiny profile, M = 1000 B, 16-token blocks)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from interlude.policy import Handling, KVAction, Phase, Profile, SchedulerView, waste
from interlude.policy.interlude_config import InterludeConfig
from interlude.policy.interlude_policy import InterludePolicy
from interlude.policy.predict import Predictor

CALLS = (("fast", 0.1), ("slow", 30.0))  # kind, seconds its calls take


def taught(
    profile: Profile,
    config: InterludeConfig | None = None,
    calls: Sequence[tuple[str, float]] = CALLS,
) -> InterludePolicy:
    """Kinds (`calls`): `fast` calls take 0.1 s and return 32 tokens, `slow` ones 30 s; every
    segment generates 160 tokens (10 blocks of growth)."""
    pol = InterludePolicy(profile, config)
    for kind, seconds in calls:
        for _ in range(4):
            pol.predictor.observe_duration(kind, seconds)
            pol.predictor.observe_segment(kind, 160)
            pol.predictor.observe_return(kind, 32)
    return pol


def admit_limit_with(
    pol: InterludePolicy,
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
    paused: Sequence[Any] = (),
    swap_queue: Sequence[Any] = (),
) -> int | None:
    """One running `fast` request (20 blocks, a whole segment to grow), three 640-token
    waiting ones (40 blocks each, 10 of growth), 100 free blocks.

    Without paused requests: 100 - 0.5 x 10 = 95 available; w0 takes 40 + 5 (50 left), w1
    45 (5 left), w2 does not fit: a limit of 2.
    """
    running = [fake_request("r", phase=Phase.RUNNING, kind="fast", gpu=320)]
    waiting = [fake_request(f"w{i}", kind="fast", pending=640) for i in range(3)]
    view = make_view(
        running=running,
        waiting=waiting,
        paused=paused,
        swap_queue=swap_queue,
        free_gpu_blocks=100,
        now=10.0,
    )
    return pol.decide(view).admit_limit


def test_room_is_kept_for_a_paused_request_back_soon(
    make_profile: Callable[..., Profile],
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    p = make_profile()
    kept = fake_request("kept", phase=Phase.PAUSED, kind="fast", gpu=160, paused_at=10.0)
    # Nothing paused: 2 (see `admit_limit_with`).
    assert admit_limit_with(taught(p), make_view, fake_request) == 2
    # A fast call kept on the GPU comes back with 32 tokens and a 160-token segment:
    # 0.5 x 1.0 x 192 / 16 = 6 blocks, 89 left: w0 takes 45 (44 left), w1 does not fit.
    assert admit_limit_with(taught(p), make_view, fake_request, paused=[kept]) == 1
    # The rule off: as if nothing were paused.
    off = taught(p, InterludeConfig(return_horizon_iterations=None))
    assert admit_limit_with(off, make_view, fake_request, paused=[kept]) == 2


def test_no_room_is_kept_for_calls_that_last_longer_than_the_horizon(
    make_profile: Callable[..., Profile],
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    slow = fake_request("slow", phase=Phase.PAUSED, kind="slow", gpu=160, paused_at=10.0)
    # No `slow` call has lasted 1 s or less: weight 0.
    assert admit_limit_with(taught(make_profile()), make_view, fake_request, paused=[slow]) == 2


def test_a_swapped_request_is_kept_room_for_its_whole_context(
    make_profile: Callable[..., Profile],
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    # 0.5 x (160 swapped + 192) / 16 = 11 blocks: 84 left, w0 takes 45, w1 does not fit.
    swapped = fake_request("out", phase=Phase.PAUSED, kind="fast", cpu=160, paused_at=10.0)
    pol = taught(make_profile())
    assert admit_limit_with(pol, make_view, fake_request, paused=[swapped]) == 1
    # Discarded (nothing held): it queues again on return, nothing is kept for it.
    gone = fake_request("gone", phase=Phase.PAUSED, kind="fast", pending=160, paused_at=10.0)
    assert admit_limit_with(taught(make_profile()), make_view, fake_request, paused=[gone]) == 2


def test_the_swap_queue_is_kept_room_for_in_full(
    make_profile: Callable[..., Profile],
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    # Back from a 30 s call, 320 tokens on the host and a 32-token answer: 22 blocks, 73
    # left: w0 takes 45 (28 left), w1 does not fit. The horizon does not matter: it is back.
    back = fake_request("back", phase=Phase.SWAP_QUEUED, kind="slow", cpu=320, pending=32)
    pol = taught(make_profile())
    assert admit_limit_with(pol, make_view, fake_request, swap_queue=[back]) == 1


def test_under_pressure_a_budgeted_swap_is_priced_at_the_requests_own_memory(
    make_profile: Callable[..., Profile],
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    """A 0.2 s call, 160 tokens, next to a 3000-token runner, with a 64-token request waiting.

    Expected keep 0.2 x 160 x 1000 = 32,000 > chunked discard 25,440 (test_interlude). The
    synchronous price 2 x 0.016 s x 3,160 x 1000 = 101,120 is above both: discard. The own
    price 2 x 0.016 s x 160 x 1000 = 5,120 is below: swap (the budget is 10 blocks).
    """
    p = make_profile()

    def decide(config: InterludeConfig) -> tuple[KVAction, ...]:
        pol = InterludePolicy(p, config)
        for _ in range(4):
            pol.predictor.observe_duration("env", 0.2)
        env = fake_request("env", phase=Phase.PAUSED, kind="env", gpu=160, paused_at=10.0)
        runner = fake_request("runner", phase=Phase.RUNNING, gpu=3000)
        view = make_view(
            running=[runner],
            waiting=[fake_request("w", pending=64)],
            paused=[env],
            now=10.0,
            swap_budget_tokens=160,
        )
        assert pol.memory_pressure(view)
        return pol.decide(view).kv

    assert decide(InterludeConfig()) == (KVAction("env", Handling.SWAP, 10),)
    sync = InterludeConfig(budgeted_swap_price=False)
    assert decide(sync) == (KVAction("env", Handling.DISCARD, 10),)


def test_the_own_swap_price_is_the_sync_swap_of_the_request_alone(
    make_profile: Callable[..., Profile],
) -> None:
    p = make_profile()
    assert waste.budgeted_swap_own(p, 160) == pytest.approx(5_120.0)
    assert waste.budgeted_swap_own(p, 160) == waste.sync_swap(p, 160, 160)


def test_returned_tokens_are_learned_from_the_context_between_segments(
    make_profile: Callable[..., Profile], fake_request: Callable[..., Any]
) -> None:
    pol = InterludePolicy(make_profile())
    # First segment ends at 300 tokens; the next ends at 400 after generating 60: the call
    # returned 400 - 60 - 300 = 40 tokens.
    pol.on_segment(fake_request("a", kind="k", gpu=300), 100)
    assert pol.predictor.return_tokens("k") == 0.0
    pol.on_segment(fake_request("a", kind="k", gpu=400), 60)
    assert pol.predictor.return_tokens("k") == 40.0


def test_predictor_share_of_calls_within_a_time() -> None:
    pred = Predictor()
    # No sample: the prior (1 s) decides.
    assert pred.fraction_within("k", 1.0) == 1.0
    assert pred.fraction_within("k", 0.5) == 0.0
    for seconds in (0.1, 0.5, 2.0, 30.0):
        pred.observe_duration("k", seconds)
    assert pred.fraction_within("k", 1.0) == 0.5
    assert pred.fraction_within("k", 0.5) == 0.5  # at most: 0.5 itself counts
    assert pred.fraction_within("k", 100.0) == 1.0
    assert pred.return_tokens("k") == 0.0
    pred.observe_return("k", 30)
    pred.observe_return("k", 50)
    assert pred.return_tokens("k") == 40.0


def test_the_horizon_is_engine_time_not_seconds(
    make_profile: Callable[..., Profile],
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    """100 iterations of the fixed cost: 1 s at 10 ms, 0.4 s at 4 ms. A kind whose calls take
    0.7 s is due back soon on the slower engine and not on the faster one."""

    def limit(fwd_c_ms: float) -> int | None:
        pol = taught(make_profile(fwd_c_ms=fwd_c_ms), calls=(*CALLS, ("mid", 0.7)))
        kept = fake_request("kept", phase=Phase.PAUSED, kind="mid", gpu=160, paused_at=10.0)
        return admit_limit_with(pol, make_view, fake_request, paused=[kept])

    assert InterludePolicy(make_profile(fwd_c_ms=4.0)).return_horizon_s == pytest.approx(0.4)
    assert InterludePolicy(make_profile()).return_horizon_s == 1.0  # GPT-J's 1 s, exactly
    # As `test_room_is_kept_for_a_paused_request_back_soon`: 6 blocks kept, w1 does not fit.
    assert limit(10.0) == 1
    assert limit(4.0) == 2


def test_a_negative_horizon_is_refused() -> None:
    with pytest.raises(ValueError, match="return_horizon_iterations"):
        InterludeConfig(return_horizon_iterations=-1.0)


def test_without_pressure_no_swap_while_memory_is_mostly_free(
    make_profile: Callable[..., Profile],
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    """A 30 s call (keep 4,800,000 against a swap price of 101,120) next to a 3000-token
    runner (188 blocks of 200 when all is held), nobody waiting."""
    p = make_profile()
    pol = taught(p)
    chat = fake_request("chat", phase=Phase.PAUSED, kind="slow", gpu=160, paused_at=10.0)
    runner = fake_request("runner", phase=Phase.RUNNING, gpu=3000)

    def decide(free: int) -> Any:
        view = make_view(
            running=[runner], paused=[chat], now=10.0, free_gpu_blocks=free, swap_budget_tokens=160
        )
        assert not pol.memory_pressure(view)
        return pol.decide(view)

    # 150 free (25 % in use): nothing, and a look again before growth can use the 100
    # blocks above the 50 that 3/4 in use leaves: each iteration the runner may take one
    # and a prefill chunk ceil(256 / 16) = 16, so at iteration 1 + 100 // 17 = 6.
    idle = decide(150)
    assert idle.kv == ()
    assert idle.review_iteration == 6
    # 40 free (80 % in use): swapped ahead of pressure.
    assert decide(40).kv == (KVAction("chat", Handling.SWAP, 10),)
    # The rule off: swapped whenever it pays, as before.
    off = taught(p, InterludeConfig(swap_ahead_usage=0.0))
    view = make_view(
        running=[runner], paused=[chat], now=10.0, free_gpu_blocks=150, swap_budget_tokens=160
    )
    assert off.decide(view).kv == (KVAction("chat", Handling.SWAP, 10),)
