"""`Decision.hold`: the simulator keeps held requests queued, in place, and admits the rest."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from interlude.policy import Decision, Profile, SchedulerView
from interlude.policy.baselines import PreservePolicy
from interlude.sim.batch import Batch
from interlude.sim.simulator import Simulator
from interlude_workloads import Arrival, Segment, TraceRequest

SimFactory = Callable[..., Simulator]


class HoldUntil(PreservePolicy):
    """Preserve, but keep `held` out of the GPU until `until` (a test double)."""

    def __init__(self, profile: Profile, held: str, until: float) -> None:
        super().__init__(profile)
        self.held, self.until = held, until

    def decide(self, view: SchedulerView) -> Decision:
        if view.now >= self.until:
            return Decision()
        # A running request's id is ignored: only queued requests can be held.
        running = frozenset(r.request_id for r in view.running)
        return Decision(hold=frozenset({self.held}) | running, review_at=self.until)


def workload() -> list[Arrival]:
    """a arrives first, b and c just after; each runs 100 prompt tokens and 200 decodes."""
    reqs = [TraceRequest(x, "k", 100, (Segment(200, None),)) for x in "abc"]
    return [Arrival(0.01 * i, r, f"{i}:{r.request_id}") for i, r in enumerate(reqs)]


@pytest.mark.parametrize("max_jump", [1, 1_000_000])
def test_held_request_waits_in_place_while_others_pass(
    max_jump: int, make_simulator: SimFactory, make_profile: Callable[..., Profile]
) -> None:
    p = make_profile()
    admitted: dict[str, float] = {}
    heads: list[str] = []

    def observe(sim: Simulator, batch: Batch, k: int) -> None:
        for r in batch.admitted:
            admitted[r.request_id] = sim.now
        if sim.waiting:
            heads.append(sim.waiting.items[0].request_id)

    policy = HoldUntil(p, "0:a", until=0.5)
    sim = make_simulator(policy, workload(), observer=observe, max_jump=max_jump)
    m = sim.run()
    assert m.finished == 3
    # b and c went ahead of the request that arrived first; a started at the first
    # iteration that began at or after 0.5 s (iterations here last at most 25 ms).
    assert admitted["1:b"] < 0.1 and admitted["2:c"] < 0.1
    assert 0.5 <= admitted["0:a"] < 0.5 + p.t_fwd(p.saturation_tokens)
    # While held it kept its place at the head of the queue (FCFS by arrival).
    assert heads and set(heads) == {"0:a"}
    assert sim.finish_log[-1] == "0:a"


def test_holding_nothing_changes_nothing(
    make_simulator: SimFactory, make_profile: Callable[..., Profile]
) -> None:
    p = make_profile()
    held = make_simulator(HoldUntil(p, "nobody", until=0.5), workload()).run()
    plain = make_simulator("preserve", workload()).run()
    assert held.finished == plain.finished == 3
    assert held.makespan_s == pytest.approx(plain.makespan_s)


class LimitUntil(PreservePolicy):
    """Preserve, admitting at most `limit` requests per iteration until `until` (a test double)."""

    def __init__(self, profile: Profile, limit: int, until: float) -> None:
        super().__init__(profile)
        self.limit, self.until = limit, until

    def decide(self, view: SchedulerView) -> Decision:
        if view.now >= self.until:
            return Decision()
        return Decision(admit_limit=self.limit, review_at=self.until)


@pytest.mark.parametrize("max_jump", [1, 1_000_000])
def test_admit_limit_caps_admissions_per_iteration_in_queue_order(
    max_jump: int, make_simulator: SimFactory, make_profile: Callable[..., Profile]
) -> None:
    admitted: list[tuple[int, list[str]]] = []

    def observe(sim: Simulator, batch: Batch, k: int) -> None:
        if batch.admitted:
            admitted.append((sim.iteration, [r.request_id for r in batch.admitted]))

    # All three arrive at once, so without a limit they share the first iteration.
    together = [Arrival(0.0, a.request, a.arrival_id) for a in workload()]
    limited = make_simulator(
        LimitUntil(make_profile(), 1, until=10.0), together, observer=observe, max_jump=max_jump
    )
    assert limited.run().finished == 3
    # One per iteration, in queue order (arrival: FCFS).
    assert [ids for _, ids in admitted] == [["0:a"], ["1:b"], ["2:c"]]
    admitted.clear()
    plain = make_simulator("preserve", together, observer=observe, max_jump=max_jump)
    assert plain.run().finished == 3
    assert [ids for _, ids in admitted] == [["0:a", "1:b", "2:c"]]


def test_admit_limit_zero_keeps_the_queue_out_until_lifted(
    make_simulator: SimFactory, make_profile: Callable[..., Profile]
) -> None:
    admitted: dict[str, float] = {}

    def observe(sim: Simulator, batch: Batch, k: int) -> None:
        for r in batch.admitted:
            admitted[r.request_id] = sim.now

    sim = make_simulator(LimitUntil(make_profile(), 0, until=0.5), workload(), observer=observe)
    assert sim.run().finished == 3
    # Nothing ran before 0.5 s (the simulator idled to the policy's review time).
    assert min(admitted.values()) == pytest.approx(0.5)


def test_no_admission_in_an_iteration_that_preempted(
    make_simulator: SimFactory, make_profile: Callable[..., Profile]
) -> None:
    # vLLM v1 skips its waiting loop in a step that preempted: the blocks freed go to the
    # running requests. Ten decodes outgrow a 20-block GPU while more requests wait.
    p = make_profile(gpu_kv_bytes=20 * 16_000)
    reqs = [TraceRequest(f"r{i}", "k", 40, (Segment(120, None),)) for i in range(10)]
    arrivals = [Arrival(0.002 * i, r, f"{i}:{r.request_id}") for i, r in enumerate(reqs)]
    preempting: list[int] = []

    def observe(sim: Simulator, batch: Batch, k: int) -> None:
        if batch.preempted and sim.waiting:
            preempting.append(len(batch.admitted))

    m = make_simulator("vllm", arrivals, observer=observe, profile=p).run()
    assert m.finished == 10
    assert preempting and set(preempting) == {0}
