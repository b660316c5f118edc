"""`interlude` under memory pressure when a context does not leave the GPU in one iteration,
when host memory is scarce, and when calls differ by tool (agent programs).

Numbers as in test_interlude.py (tiny profile, M = 1000 B, a paused request of 160 tokens =
10 blocks, C_other = 3000): conversion 25,440; under pressure a swap costs the request's own
memory while copied out and back, 2 x T_swap(160) x 160 x 1000 = 5,120 (T_swap(160) =
0.016 s), and waiting for the link to copy n blocks ahead of it and its own costs
T_swap(16 n) x 160 x 1000.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from interlude.policy import Handling, KVAction, Phase, Profile, SchedulerView
from interlude.policy.interlude_policy import InterludePolicy
from interlude.policy.types import UNKNOWN_TOOL


@pytest.fixture
def policy(make_profile: Callable[..., Profile], fake_request: Callable[..., Any]) -> Any:
    pol = InterludePolicy(make_profile())
    for kind, seconds in (("chat", 30.0), ("env", 0.2)):
        for _ in range(5):
            pol.on_resume(fake_request("old", kind=kind), 0.0, seconds)
    return pol


def under_pressure(
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
    paused: list[Any],
    **kwargs: Any,
) -> SchedulerView:
    runner = fake_request("runner", phase=Phase.RUNNING, gpu=3000)
    waiting = [fake_request("w", pending=64)]
    return make_view(running=[runner], waiting=waiting, paused=paused, now=10.0, **kwargs)


def paused(fake_request: Callable[..., Any], rid: str, kind: str, tool: str | None = None) -> Any:
    r = fake_request(rid, phase=Phase.PAUSED, kind=kind, gpu=160, paused_at=10.0)
    r.tool = tool
    return r


def test_a_context_the_link_takes_soon_is_kept_for_it_not_dropped(
    policy: InterludePolicy,
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    chat = paused(fake_request, "chat", "chat")
    # Budget of 4 blocks: 4 leave now. The other 6 would wait T_swap(160) = 0.016 s for the
    # link: 2,560 + 5,120 < 25,440, so they stay for the next iterations' budgets.
    view = under_pressure(make_view, fake_request, [chat], swap_budget_tokens=64, iteration=7)
    assert policy.memory_pressure(view)
    d = policy.decide(view)
    assert d.kv == (KVAction("chat", Handling.SWAP, 4),)
    assert d.review_iteration == 8  # the rest goes with the next iteration's budget
    # Without host room for the rest, it is dropped as before.
    full = under_pressure(make_view, fake_request, [chat], swap_budget_tokens=64, free_cpu_blocks=4)
    assert policy.decide(full).kv == (
        KVAction("chat", Handling.SWAP, 4),
        KVAction("chat", Handling.DISCARD, 6),
    )


def test_scarce_host_memory_goes_to_the_call_back_soonest(
    policy: InterludePolicy,
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    chat = paused(fake_request, "chat", "chat")  # 30 s left: keep 4,800,000
    env = paused(fake_request, "env", "env")  # 0.2 s left: keep 32,000
    # Both are worth more than their swap (5,120) and their conversion (25,440); the host
    # has room for one. The host copy saves one recompute either way, and env gives it back
    # 150 times sooner: env is copied, chat (whose recompute is the smaller share of its
    # pause) dropped.
    view = under_pressure(
        make_view, fake_request, [chat, env], swap_budget_tokens=160, free_cpu_blocks=10
    )
    assert policy.decide(view).kv == (
        KVAction("env", Handling.SWAP, 10),
        KVAction("chat", Handling.DISCARD, 10),
    )


def test_a_call_is_predicted_by_its_tool(
    make_profile: Callable[..., Profile],
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    pol = InterludePolicy(make_profile())
    for tool, seconds in (("read_file", 0.001), ("run_tests", 60.0)):
        for _ in range(5):
            pol.on_resume(paused(fake_request, "old", "agent", tool), 0.0, seconds)
    read = paused(fake_request, "read", "agent", "read_file")
    test = paused(fake_request, "test", "agent", "run_tests")
    # Same kind, one tool back in a millisecond (keep 160 < swap 5,120: stays), the other
    # in a minute (copied out). By the kind alone both would expect 30 s and both leave.
    view = under_pressure(make_view, fake_request, [read, test], swap_budget_tokens=320)
    assert pol.decide(view).kv == (KVAction("test", Handling.SWAP, 10),)


def test_a_real_models_call_that_names_no_tool_yet_is_predicted_by_its_kind(
    make_profile: Callable[..., Profile],
    make_view: Callable[..., SchedulerView],
    fake_request: Callable[..., Any],
) -> None:
    # An engine's pause of a real model names `UNKNOWN_TOOL` (the front end parses the call
    # after the turn). Pooled as one tool, the calculator's calls (a millisecond) would share
    # the chat turns' minute and be copied out; by their kind they stay (keep 160 < swap
    # 5,120), and only the chat call leaves.
    pol = InterludePolicy(make_profile())
    for kind, seconds in (("calc", 0.001), ("chat", 60.0)):
        for _ in range(5):
            pol.on_resume(paused(fake_request, "old", kind, UNKNOWN_TOOL), 0.0, seconds)
    calc = paused(fake_request, "calc", "calc", UNKNOWN_TOOL)
    chat = paused(fake_request, "chat", "chat", UNKNOWN_TOOL)
    view = under_pressure(make_view, fake_request, [calc, chat], swap_budget_tokens=320)
    assert pol.decide(view).kv == (KVAction("chat", Handling.SWAP, 10),)
