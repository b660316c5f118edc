"""A resumed turn whose KV was discarded, on vLLM's real scheduler (no model: the test feeds the
sampled tokens): it is ranked by the policy like any request, and a policy's starvation guard
counts its wait, as the simulator's does (`tests/sim/test_resumed_rank.py`).

vLLM's session update clears a resumed turn's outputs, and a resume whose KV left the GPU
restarts from token 0, so the request alone looks as if it never ran; the starvation guard of
`lamps` and `interlude` counts only requests that ran, so before the scheduler remembered which
requests it had scheduled, a discarded resume's wait was never counted on the engine and new
arrivals the policy ranked ahead kept it waiting without bound.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from vllm import SamplingParams
from vllm.v1.request import Request, RequestStatus

from interlude.enginecore.views import RequestMeta
from interlude.policy import Decision, Handling, KVAction, Profile, SchedulerView
from interlude.policy.interlude_policy import InterludePolicy
from interlude.policy.starvation import StarvationGuard
from interlude.policy.types import RequestView

THRESHOLD = 4  # iterations a request that ran may wait before it is promoted
HELD_STEPS = THRESHOLD + 2


class DiscardAndHold(InterludePolicy):
    """`interlude`'s ranking and starvation guard (threshold 4); every paused request's KV is
    discarded at once, and every waiting request is held while `holding` (so that the queue
    stands still for a few steps), then all are let through together."""

    def __init__(self, profile: Profile, hold_s: tuple[float, float] | None = None) -> None:
        super().__init__(profile)
        self.starvation = StarvationGuard(THRESHOLD)
        self.holding = False
        self.hold_s = hold_s  # (from, until) in the view's time: the simulator's switch
        self.seen: dict[str, bool] = {}  # request id -> scheduled_once at its queue entry
        self.orders: list[list[str]] = []  # the waiting queue, in order, at each decision

    def queue_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        self.seen[req.request_id] = req.scheduled_once
        return super().queue_key(req, now)

    def decide(self, view: SchedulerView) -> Decision:
        requeue, _ = self.observe(view)
        p = view.profile
        kv = tuple(
            KVAction(r.request_id, Handling.DISCARD, p.blocks(r.gpu_tokens))
            for r in view.paused
            if r.gpu_tokens > 0
        )
        self.orders.append([r.request_id for r in view.waiting])
        review = None
        if self.hold_s is not None:
            self.holding = self.hold_s[0] <= view.now < self.hold_s[1]
            review = view.now + 0.01 if self.holding else None  # keep the simulator deciding
        hold = frozenset(r.request_id for r in view.waiting) if self.holding else frozenset()
        return Decision(kv=kv, requeue=requeue, hold=hold, review_at=review)


@pytest.fixture
def scheduler(real_scheduler: Any) -> Any:
    real_scheduler.ipolicy = DiscardAndHold(real_scheduler.profile)
    return real_scheduler


def turn(s: Any, rid: str, tokens: list[int], tool: str | None, calls_done: int = 0) -> Request:
    """A streaming-input session's turn of one sampled token, as `s`'s engine core makes it."""
    meta = RequestMeta(kind="chat", arrival=0.0, tool=tool, calls_done=calls_done)
    params = SamplingParams(max_tokens=1, ignore_eos=True, extra_args=meta.to_extra_args())
    return Request(rid, tokens, params, None, resumable=True, block_hasher=s.test_hasher)


def step(s: Any) -> list[str]:
    """One scheduler step with a fake forward pass (conftest's `fake_step`): the ids vLLM
    admitted from its queues, in order."""
    return [r.req_id for r in s.test_step().scheduled_new_reqs]


def discarded_resume(s: Any, session: Callable[[], None]) -> None:
    """Session "old" runs a turn, calls a tool, loses its KV at the pause and comes back."""
    s.add_request(turn(s, "old", list(range(16, 16 + 200)), tool="search"))
    assert step(s) == ["old"]  # prefilled, samples its last token: the turn ends at the call
    assert s.requests["old"].status == RequestStatus.WAITING_FOR_STREAMING_REQ
    assert "old" in s.lot.parked
    step(s)  # the policy discards the parked KV
    assert not s.lot.parked["old"].on_gpu
    session()
    # The tool's answer: the next turn of the same streaming session.
    s.add_request(turn(s, "old", list(range(300, 340)), tool=None, calls_done=1))


def test_a_discarded_resume_shows_it_ran_and_its_wait_is_counted(scheduler: Any) -> None:
    s = scheduler
    policy: DiscardAndHold = s.ipolicy

    def hold_from_now() -> None:
        policy.holding = True

    discarded_resume(s, hold_from_now)
    assert s.requests["old"].num_computed_tokens == 0  # restarts from token 0
    # A new conversation arrives after the resume; the policy ranks it ahead (smaller area).
    s.add_request(turn(s, "new", list(range(500, 530)), tool="search"))
    assert [r.request_id for r in s.waiting] == ["new", "old"]
    assert policy.seen["old"] is True  # the simulator's request says the same
    assert policy.seen["new"] is False
    for _ in range(HELD_STEPS):
        assert step(s) == []  # held: both wait
    # The guard promoted the resumed turn: it heads the queue and is admitted first.
    assert policy.starvation.promotion("old") is not None
    policy.holding = False
    assert step(s) == ["old", "new"]


def test_without_the_guard_the_policy_s_key_ranks_a_discarded_resume(scheduler: Any) -> None:
    # Not behind new arrivals as a class: a resume whose key is smaller goes first.
    s = scheduler
    policy: DiscardAndHold = s.ipolicy
    discarded_resume(s, lambda: None)
    s.add_request(turn(s, "new", list(range(500, 1000)), tool="search"))  # a long prompt
    assert [r.request_id for r in s.waiting] == ["old", "new"]
    assert policy.starvation.promotion("old") is None
    assert step(s)[0] == "old"


def simulated_order(profile: Profile, prompts: tuple[int, ...]) -> tuple[bool, list[str]]:
    """The same scenario in the simulator, with the same policy: whether the discarded resume
    showed it ran, and the waiting queue's order once every request is ranked."""
    from interlude.sim.config import SimConfig
    from interlude.sim.simulator import Simulator
    from interlude_workloads import Arrival
    from interlude_workloads.types import Segment, TraceCall, TraceRequest

    old = TraceRequest(
        "old", "chat", 200, (Segment(1, TraceCall("search", 0.1, 40)), Segment(1, None))
    )
    arrivals = [Arrival(0.0, old, "old")]
    for n in prompts:
        new = TraceRequest(f"new{n}", "chat", n, (Segment(1, None),))
        arrivals.append(Arrival(0.3, new, f"new{n}"))
    policy = DiscardAndHold(profile, hold_s=(0.05, 0.6))
    Simulator(profile, policy, arrivals, SimConfig(check_integrity=True)).run()
    everyone = {"old", *(f"new{n}" for n in prompts)}
    ranked = [o for o in policy.orders if set(o) == everyone]
    return policy.seen["old"], ranked[-1]


@pytest.mark.parametrize("prompts", [(30,), (500,), (30, 500)])
def test_the_engine_and_the_simulator_rank_a_discarded_resume_alike(
    scheduler: Any, prompts: tuple[int, ...]
) -> None:
    s = scheduler
    discarded_resume(s, lambda: None)
    s.ipolicy.holding = True
    for n in prompts:
        s.add_request(turn(s, f"new{n}", list(range(500, 500 + n)), tool="search"))
    engine_order = [r.request_id for r in s.waiting]
    sim_ran, sim_order = simulated_order(s.profile, prompts)
    assert (s.ipolicy.seen["old"], engine_order) == (sim_ran, sim_order)
