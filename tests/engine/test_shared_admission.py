"""The engine tells the policy which blocks of a waiting request others hold already, on
vLLM's real scheduler (no model: the test feeds the sampled tokens). A conversation parked at
a tool call keeps its KV on the GPU; a new one with the same system block arrives, and the
policy's view counts those blocks as shared (`SchedulerView.shared_blocks`), which its
admission and pressure margin then do not count again (`tests/policy/test_admission.py`)."""

from __future__ import annotations

from typing import Any

from vllm.v1.request import RequestStatus

from interlude.policy import Decision, SchedulerView
from interlude.policy.interlude_policy import InterludePolicy

from .test_resumed_rank import scheduler, step, turn

__all__ = ["scheduler"]  # a fixture this module uses


class Recording(InterludePolicy):
    """`interlude` as shipped, keeping every view it decides on."""

    views: list[SchedulerView]

    def decide(self, view: SchedulerView) -> Decision:
        self.views.append(view)
        return super().decide(view)


def test_a_parked_conversation_s_prefix_is_shared_with_a_new_one(scheduler: Any) -> None:
    s = scheduler
    policy = Recording(s.profile)
    policy.views = []
    s.ipolicy = policy
    bs = s.block_size
    system = list(range(16, 16 + 3 * bs))  # the chat template's block, three full blocks
    s.add_request(turn(s, "old", [*system, *range(200, 240)], tool="search"))
    assert step(s) == ["old"]  # prefilled; its turn ends at the call and it parks
    assert s.requests["old"].status == RequestStatus.WAITING_FOR_STREAMING_REQ
    assert s.lot.parked["old"].on_gpu  # no pressure: its KV stays
    s.add_request(turn(s, "new", [*system, *range(300, 330)], tool="search"))
    unique = list(range(400, 400 + 2 * bs))
    s.add_request(turn(s, "other", unique, tool="search"))
    policy.views.clear()
    step(s)
    first = policy.views[0]
    assert {r.request_id for r in first.waiting} == {"new", "other"}
    assert dict(first.shared_blocks) == {"new": 3}
