"""InferCept's min-waste schedule on hand-built views.

Numbers (tiny profile, M = 1000 B): a paused request holds C_i = 160 tokens (10 blocks); one
running request holds C_other = 3000 tokens and decodes (1 running token, so a recompute chunk
is S - 1 = 255 tokens and 160 tokens recompute in n = 1 chunk). T_fwd(160) = 8 + 10 = 18 ms,
and the chunk adds a x 160 = 8 ms to an iteration the runner takes anyway (eq. 4, waste.py):

    ChunkedDiscard = 0.018 x 160 x 1000 / 2 + 0.008 x 3000 x 1000 = 1,440 + 24,000 = 25,440
    Preserve(t)    = t x 160 x 1000 = 160,000 t   -> equal at t = 25,440 / 160,000 = 0.159 s
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from interlude.policy import (
    Handling,
    KVAction,
    Phase,
    Profile,
    SchedulerView,
    make_policy,
    waste,
)
from interlude.policy.base import swap_out_budget_blocks
from interlude.policy.infercept import InferCeptPolicy

DISC = 25_440.0
CROSS = DISC / 160_000  # 0.159 s of elapsed call time


@pytest.fixture
def view_with(
    make_view: Callable[..., SchedulerView], fake_request: Callable[..., Any]
) -> Callable[..., SchedulerView]:
    def build(paused: list[Any], **kwargs: Any) -> SchedulerView:
        runner = fake_request("runner", phase=Phase.RUNNING, gpu=3000)
        return make_view(running=[runner], paused=paused, **kwargs)

    return build


def paused_req(fake_request: Callable[..., Any], rid: str, arrival: float, at: float) -> Any:
    return fake_request(rid, phase=Phase.PAUSED, arrival=arrival, gpu=160, paused_at=at)


def test_view_numbers(view_with: Callable[..., SchedulerView]) -> None:
    view = view_with([])
    assert (view.running_tokens, view.running_context) == (1, 3000)
    assert waste.chunked_discard(view.profile, 160, 3000, 1) == pytest.approx(DISC)


def test_swaps_highest_waste_first(
    view_with: Callable[..., SchedulerView], fake_request: Callable[..., Any]
) -> None:
    # a: paused 1.0 s -> min(160,000, 25,440) = 25,440; b: paused 0.1 s -> min(16,000, ...)
    # = 16,000. a ranks first although b arrived earlier. The budget is exactly 10 blocks.
    a = paused_req(fake_request, "a", arrival=1.0, at=9.0)
    b = paused_req(fake_request, "b", arrival=0.0, at=9.9)
    view = view_with([b, a], now=10.0, swap_budget_tokens=160)
    d = make_policy("infercept", view.profile).decide(view)
    assert d.kv == (KVAction("a", Handling.SWAP, 10),)
    # b is preserved (16,000 < 25,440) until its preserve waste reaches the discard cost.
    assert d.review_at == pytest.approx(9.9 + CROSS)


def test_partial_swap_within_budget_rest_discarded(
    view_with: Callable[..., SchedulerView], fake_request: Callable[..., Any]
) -> None:
    a = paused_req(fake_request, "a", arrival=1.0, at=9.0)
    b = paused_req(fake_request, "b", arrival=0.0, at=9.9)
    view = view_with([a, b], now=10.0, swap_budget_tokens=80)  # 80 // 16 = 5 blocks
    d = make_policy("infercept", view.profile).decide(view)
    # a: 5 blocks swapped, the other 5 discarded (Preserve 160,000 >= 25,440); b: no budget
    # left, and preserved (16,000 < 25,440).
    assert d.kv == (KVAction("a", Handling.SWAP, 5), KVAction("a", Handling.DISCARD, 5))


@pytest.mark.parametrize(
    ("free_cpu", "swapped"),
    [
        (100, 7),  # (160 - 48 planned swap-in tokens) // 16 = 7 blocks
        (3, 3),  # host memory holds only 3 more blocks
    ],
)
def test_budget_leaves_room_for_swap_ins_and_host_memory(
    view_with: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
    free_cpu: int,
    swapped: int,
) -> None:
    a = paused_req(fake_request, "a", arrival=1.0, at=9.0)
    back = fake_request("back", phase=Phase.SWAP_QUEUED, cpu=48, pending=10)
    view = view_with(
        [a], swap_queue=[back], now=10.0, swap_budget_tokens=160, free_cpu_blocks=free_cpu
    )
    d = make_policy("infercept", view.profile).decide(view)
    assert swap_out_budget_blocks(view) == swapped
    assert d.kv == (
        KVAction("a", Handling.SWAP, swapped),
        KVAction("a", Handling.DISCARD, 10 - swapped),
    )


def test_fresh_pause_preserved_then_discarded_at_the_crossing(
    view_with: Callable[..., SchedulerView], fake_request: Callable[..., Any]
) -> None:
    a = paused_req(fake_request, "a", arrival=0.0, at=10.0)
    policy = make_policy("infercept", view_with([]).profile)
    # No swap budget (host memory full). Just paused: estimate 0 s, Preserve 0 < 25,440.
    d = policy.decide(view_with([a], now=10.0, free_cpu_blocks=0))
    assert d.kv == ()
    assert d.review_at == pytest.approx(10.0 + CROSS)  # 10.159
    before = policy.decide(view_with([a], now=10.0 + CROSS - 1e-6, free_cpu_blocks=0))
    assert before.kv == ()
    after = policy.decide(view_with([a], now=10.0 + CROSS + 1e-6, free_cpu_blocks=0))
    assert after.kv == (KVAction("a", Handling.DISCARD, 10),)


def test_requests_without_gpu_blocks_are_skipped(
    view_with: Callable[..., SchedulerView], fake_request: Callable[..., Any]
) -> None:
    gone = fake_request("gone", phase=Phase.PAUSED, pending=160, paused_at=0.0)
    away = fake_request("away", phase=Phase.PAUSED, cpu=160, paused_at=0.0)
    view = view_with([gone, away], now=100.0)
    assert make_policy("infercept", view.profile).decide(view).kv == ()


def test_tool_profile_estimator(
    view_with: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
    make_profile: Callable[..., Profile],
) -> None:
    policy = InferCeptPolicy(make_profile(), estimator="tool-profile")
    a = paused_req(fake_request, "a", arrival=0.0, at=10.0)
    a.kind = "chat"
    policy.on_resume(a, 5.0, 30.0)  # chat calls last 30 s
    # Just paused, yet the estimate is 30 s: Preserve 4,800,000 >= 25,440 -> discard at once.
    d = policy.decide(view_with([a], now=10.0, free_cpu_blocks=0))
    assert d.kv == (KVAction("a", Handling.DISCARD, 10),)
    with pytest.raises(ValueError, match=r"estimator"):
        InferCeptPolicy(make_profile(), estimator="oracle")
