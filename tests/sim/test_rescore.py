"""Policies that re-rank their queues every iteration (`Traits.rescore_queued`, LAMPS)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import ClassVar

from interlude.policy import (
    BatchMode,
    Decision,
    Handling,
    Profile,
    RequestView,
    SchedulerView,
    Traits,
)
from interlude.policy.base import Policy
from interlude.sim.ranked_queue import PREEMPTED, RankedQueue
from interlude.sim.request import SimRequest
from interlude.sim.simulator import Simulator
from interlude_workloads import Arrival, Segment, TraceCall, TraceRequest

SimFactory = Callable[..., Simulator]
Recorder = Callable[..., list[tuple[SchedulerView, Decision]]]


def sim_request(rid: str) -> SimRequest:
    return SimRequest(rid, TraceRequest(rid, "k", 10, (Segment(5, None),)), 0.0)


def test_rekey_reorders_ranked_keeps_preempted_at_head_and_ties_in_entry_order() -> None:
    q = RankedQueue()
    a, b, c, d, p = (sim_request(x) for x in "abcdp")
    for r, key in ((a, 1.0), (b, 2.0), (c, 3.0), (d, 2.0)):
        q.push(r, (key,))
    q.push(p, (), PREEMPTED)
    assert [r.request_id for r in q] == ["p", "a", "b", "d", "c"]
    new = {"a": 5.0, "b": 4.0, "c": 0.0, "d": 4.0}
    asked: list[str] = []

    def keys(rs: list[SimRequest]) -> list[tuple[float, ...]]:
        asked.extend(r.request_id for r in rs)
        return [(new[r.request_id],) for r in rs]

    q.rekey(keys)
    # c now ranks first among the ranked; b and d tie and keep their entry order (b, then d);
    # the preempted request stays at the head and is not asked.
    assert [r.request_id for r in q] == ["p", "c", "b", "d", "a"]
    assert sorted(asked) == ["a", "b", "c", "d"]
    q.pop_front(2)  # ranks and items stay aligned after a rekey
    q.push(sim_request("e"), (4.5,))
    assert [r.request_id for r in q] == ["b", "d", "e", "a"]


class TableKeys(Policy):
    """Keys come from a table the test edits; counts how often each request is asked."""

    name = "table-keys"
    traits: ClassVar[Traits] = Traits(batch_mode=BatchMode.CHUNKED)
    description = "test policy"

    def __init__(self, profile: Profile, table: dict[str, float]) -> None:
        super().__init__(profile)
        self.table = table
        self.asked: Counter[str] = Counter()
        self.decisions = 0

    def decide(self, view: SchedulerView) -> Decision:
        self.decisions += 1
        if self.decisions == 2:
            # The batch state changed (here: the test's table); "z" should now go first.
            self.table["z"] = -1.0
        return Decision()

    def queue_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        self.asked[req.request_id] += 1
        return (self.table[req.request_id.split(":")[1]],)


class RescoringTableKeys(TableKeys):
    traits: ClassVar[Traits] = Traits(batch_mode=BatchMode.CHUNKED, rescore_queued=True)


def _one_at_a_time(make_profile: Callable[..., Profile]) -> tuple[Profile, list[Arrival]]:
    # max_num_seqs = 1: one request runs, the other three wait in the queue behind it.
    p = make_profile(max_num_seqs=1)
    reqs = [TraceRequest(x, "k", 20, (Segment(30, None),)) for x in "wxyz"]
    return p, [Arrival(0.0, r, f"{i}:{r.request_id}") for i, r in enumerate(reqs)]


def test_simulator_asks_queue_keys_again_each_iteration_only_when_the_policy_rescores(
    make_profile: Callable[..., Profile], make_simulator: SimFactory
) -> None:
    p, arrivals = _one_at_a_time(make_profile)
    table = {"w": 0.0, "x": 1.0, "y": 2.0, "z": 3.0}
    once = TableKeys(p, dict(table))
    sim = make_simulator(once, arrivals, profile=p)
    sim.run()
    # Asked once per entry: z keeps the key it entered with and runs last despite its new one.
    assert sim.finish_log == ["0:w", "1:x", "2:y", "3:z"]
    assert set(once.asked.values()) == {1}
    again = RescoringTableKeys(p, dict(table))
    sim = make_simulator(again, arrivals, profile=p)
    sim.run()
    # w runs first (ranked at entry); from the second decision on, z's key is the lowest,
    # and the rescored queue runs it next, ahead of x and y that entered before it.
    assert sim.finish_log == ["0:w", "3:z", "1:x", "2:y"]
    # w was admitted at once (asked once); the others were asked at every step they waited.
    assert again.asked["0:w"] == 1
    assert 1 < again.asked["3:z"] < again.asked["1:x"] < again.asked["2:y"]


def test_lamps_swaps_on_a_fast_host_link(
    make_profile: Callable[..., Profile], make_simulator: SimFactory, record_decisions: Recorder
) -> None:
    """At 1 GB/s a sync swap of a 2 s call's context costs less than recomputing it, so LAMPS
    swaps (within the budget); the simulator checks block conservation after every step."""
    p = make_profile(swap_bandwidth_bps=1e9)
    segments = (Segment(20, TraceCall("slow", 2.0, 10)), Segment(20, None))
    reqs = [TraceRequest(f"r{i}", "slow", 300, segments) for i in range(4)]
    arrivals = [Arrival(0.05 * i, r, f"{i}:{r.request_id}") for i, r in enumerate(reqs)]
    sim = make_simulator("lamps", arrivals, profile=p)
    log = record_decisions(sim)
    m = sim.run()
    assert m.finished == 4
    assert m.swapped_tokens > 0
    assert {a.handling for _, d in log for a in d.kv} == {Handling.SWAP}


def test_lamps_reads_the_trace_lamps_predicted_does_not(
    make_simulator: SimFactory, record_decisions: Recorder
) -> None:
    """A 1,000-token request calls a 0.05 s tool while a 1,000-token request runs beside it.

    The truth (C = 1,005 at the call, C_other = 1,000, tiny profile):
        preserve       0.05 x 1,005 x 1000                             =  50,250
        chunked disc.  T_fwd(1,005) x 1,005 x 1000 / 2 + a x 1,005 x 1,000 x 1000
                       = 0.06025 x 502,500 + 50,250                    =  80,526
    so `lamps` preserves; `lamps-predicted` has only the 1 s prior (preserve 1,005,000) and
    discards. The request arrives after the runner's first iteration, so it is ranked with the
    runner in the batch.
    """
    runner = TraceRequest("runner", "r", 1000, (Segment(300, None),))
    req = TraceRequest("big", "k", 1000, (Segment(5, TraceCall("k", 0.05, 5)), Segment(5, None)))
    arrivals = [Arrival(0.0, runner, "0:runner"), Arrival(0.001, req, "1:big")]
    actions = {}
    for name in ("lamps", "lamps-predicted"):
        sim = make_simulator(name, arrivals)
        log = record_decisions(sim)
        m = sim.run()
        actions[name] = [(a.request_id, a.handling) for _, d in log for a in d.kv]
        assert m.finished == 2
    assert actions == {"lamps": [], "lamps-predicted": [("1:big", Handling.DISCARD)]}
