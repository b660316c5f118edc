"""`StarvationGuard`: LAMPS's counter, +1 per iteration a once-scheduled request waits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from interlude.policy import Phase
from interlude.policy.starvation import STARVATION_THRESHOLD, StarvationGuard


def test_threshold_is_the_papers_100() -> None:
    assert STARVATION_THRESHOLD == 100
    assert StarvationGuard().threshold == 100
    with pytest.raises(ValueError, match=r"threshold"):
        StarvationGuard(0)


def test_promoted_at_100_not_at_99(fake_request: Callable[..., Any]) -> None:
    g = StarvationGuard()
    r = fake_request("a", queue_iteration=10, queue_time=1.0, scheduled_once=True)
    g.on_queued(r)
    # Entered at iteration 10; at iteration 109 it has waited 99 iterations.
    assert g.update(109) == ((), 110)  # nothing yet; the next check is due at 110
    assert g.promotion("a") is None
    assert g.update(110) == (("a",), None)  # 100 iterations: promoted
    assert g.promotion("a") == 1
    assert g.update(500) == ((), None)  # promoted once only


def test_engine_that_skips_iterations_still_promotes(fake_request: Callable[..., Any]) -> None:
    g = StarvationGuard()
    g.on_queued(fake_request("a", queue_iteration=10, scheduled_once=True))
    assert g.update(250) == (("a",), None)  # first look long after the due iteration


def test_never_scheduled_request_is_not_counted(fake_request: Callable[..., Any]) -> None:
    g = StarvationGuard()
    g.on_queued(fake_request("new", queue_iteration=0, scheduled_once=False))
    assert g.update(10_000) == ((), None)
    assert g.promotion("new") is None


def test_request_that_left_the_queue_is_not_promoted(fake_request: Callable[..., Any]) -> None:
    g = StarvationGuard()
    ran = fake_request("ran", queue_iteration=0, queue_time=0.5, scheduled_once=True)
    requeued = fake_request("requeued", queue_iteration=0, queue_time=0.5, scheduled_once=True)
    g.on_queued(ran)
    g.on_queued(requeued)
    ran.phase = Phase.RUNNING  # admitted before its wait reached 100
    requeued.queue_time = 0.9  # ran and came back: a new wait, counted from its new entry
    assert g.update(100) == ((), None)
    assert g.promotion("ran") is None and g.promotion("requeued") is None


def test_promotion_order_and_forget(fake_request: Callable[..., Any]) -> None:
    g = StarvationGuard()
    g.on_queued(fake_request("late", queue_iteration=50, scheduled_once=True))
    g.on_queued(fake_request("early", queue_iteration=20, scheduled_once=True))
    assert g.update(120) == (("early",), 150)
    assert g.update(150) == (("late",), None)
    assert (g.promotion("early"), g.promotion("late")) == (1, 2)
    g.forget("early")  # finished: forgotten
    assert g.promotion("early") is None
    assert g.promotion("late") == 2
    g.forget("never-seen")  # harmless


def test_promoted_request_not_counted_again(fake_request: Callable[..., Any]) -> None:
    g = StarvationGuard()
    r = fake_request("a", queue_iteration=0, scheduled_once=True)
    g.on_queued(r)
    assert g.update(100) == (("a",), None)
    r.queue_iteration = 200
    g.on_queued(r)  # re-entering the queue while promoted starts no new count
    assert g.update(300) == ((), None)
    assert g.promotion("a") == 1


def test_asked_again_while_waiting_counts_one_wait(fake_request: Callable[..., Any]) -> None:
    """A policy that re-ranks every iteration reports the same wait many times: the count
    neither restarts nor doubles; a new entry (another queue time or iteration) restarts it."""
    g = StarvationGuard()
    r = fake_request("a", queue_iteration=10, queue_time=1.0, scheduled_once=True)
    for _ in range(50):
        g.on_queued(r)
    assert len(g._due) == 1  # one pending wait, not one per ask (it would grow every iteration)
    assert g.update(109) == ((), 110)  # still due 100 iterations after the entry at 10
    assert g.update(110) == (("a",), None)  # promoted once, not once per ask
    b = fake_request("b", queue_iteration=10, queue_time=1.0, scheduled_once=True)
    g.on_queued(b)
    b.queue_iteration, b.queue_time = 60, 3.0  # ran, came back: a new wait
    g.on_queued(b)
    assert g.update(110) == ((), 160)  # the old wait is stale, the new one is due at 160
    assert g.update(160) == (("b",), None)
