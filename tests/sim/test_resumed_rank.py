"""A resumed turn whose KV was discarded, in the simulator: ranked by the policy's key like any
request, and counted by the starvation guard as a request that ran, so new arrivals the policy
ranks ahead cannot keep it waiting for more than the guard's threshold. The engine follows the
same rule (`tests/engine/test_resumed_rank.py`, which also runs this scenario on both and
compares the order)."""

from __future__ import annotations

from collections.abc import Callable

from interlude.policy import Decision, Handling, KVAction, Profile, SchedulerView
from interlude.policy.interlude_policy import InterludePolicy
from interlude.policy.starvation import StarvationGuard
from interlude.policy.types import RequestView
from interlude.sim.config import SimConfig
from interlude.sim.simulator import Simulator
from interlude_workloads import Arrival
from interlude_workloads.types import Segment, TraceCall, TraceRequest

THRESHOLD = 4


class DiscardAndHold(InterludePolicy):
    """`interlude`'s keys and guard (threshold 4); paused KV discarded at once; waiting
    requests held while the view's time is in `hold_s`."""

    def __init__(self, profile: Profile, hold_s: tuple[float, float], threshold: int) -> None:
        super().__init__(profile)
        self.starvation = StarvationGuard(threshold)
        self.hold_s = hold_s
        self.seen: dict[str, list[bool]] = {}  # request id -> scheduled_once at each entry
        self.admitted: list[str] = []

    def queue_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        self.seen.setdefault(req.request_id, []).append(req.scheduled_once)
        return super().queue_key(req, now)

    def decide(self, view: SchedulerView) -> Decision:
        requeue, _ = self.observe(view)
        p = view.profile
        kv = tuple(
            KVAction(r.request_id, Handling.DISCARD, p.blocks(r.gpu_tokens))
            for r in view.paused
            if r.gpu_tokens > 0
        )
        holding = self.hold_s[0] <= view.now < self.hold_s[1]
        hold = frozenset(r.request_id for r in view.waiting) if holding else frozenset()
        return Decision(kv=kv, requeue=requeue, hold=hold)


def run(
    profile: Profile, hold_s: tuple[float, float], threshold: int = THRESHOLD
) -> DiscardAndHold:
    """ "old" runs a turn, calls a tool (0.1 s), loses its KV and comes back; "new" (a short
    prompt: a smaller key) arrives after it; "busy" decodes all along, so iterations pass."""
    busy = TraceRequest("busy", "chat", 8, (Segment(600, None),))
    old = TraceRequest(
        "old", "chat", 200, (Segment(1, TraceCall("search", 0.1, 40)), Segment(1, None))
    )
    new = TraceRequest("new", "chat", 30, (Segment(1, None),))
    arrivals = [Arrival(0.0, busy, "busy"), Arrival(0.0, old, "old"), Arrival(0.2, new, "new")]
    policy = DiscardAndHold(profile, hold_s, threshold)

    def admitted(sim: Simulator, batch: object, k: int) -> None:
        policy.admitted += [r.request_id for r in getattr(batch, "admitted", ())]

    Simulator(profile, policy, arrivals, SimConfig(check_integrity=True), observer=admitted).run()
    return policy


def test_a_discarded_resume_is_counted_as_a_request_that_ran(
    make_profile: Callable[..., Profile],
) -> None:
    policy = run(make_profile(), hold_s=(0.05, 0.5))
    # Its first entry, then the discarded resume (asked again once promoted).
    assert policy.seen["old"][:2] == [False, True]
    assert policy.seen["new"] == [False]
    # Held together for many iterations: the guard promoted the resumed turn, which goes
    # first although the policy's key ranks the new, smaller request ahead of it.
    assert policy.admitted == ["busy", "old", "old", "new"]


def test_without_the_guard_the_key_decides(make_profile: Callable[..., Profile]) -> None:
    policy = run(make_profile(), hold_s=(0.05, 0.5), threshold=10_000)
    assert policy.admitted == ["busy", "old", "new", "old"]
