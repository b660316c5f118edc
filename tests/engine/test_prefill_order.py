"""A prefill engine's queue (enginecore/prefill_order.py): prefill jobs for decode engines go
shortest prompt first within scheduling batches, ahead of sessions and behind swap-ins."""

from __future__ import annotations

from collections.abc import Callable

from vllm import SamplingParams
from vllm.v1.request import Request

from interlude.enginecore.parking import ParkingLot
from interlude.enginecore.policy_queue import PolicyQueue
from interlude.enginecore.prefill_order import PrefillOrder, queued_prefill_tokens
from interlude.enginecore.request_views import RequestViews
from interlude.enginecore.scheduler import InterludeScheduler
from interlude.policy import Profile
from interlude.policy.infercept import InferCeptPolicy


def job(rid: str, prompt: int) -> Request:
    params = SamplingParams(
        max_tokens=1, extra_args={"kv_transfer_params": {"do_remote_decode": True}}
    )
    return Request(rid, list(range(prompt)), params, None)


def session(rid: str, prompt: int) -> Request:
    return Request(rid, list(range(prompt)), SamplingParams(max_tokens=4), None)


def scheduler(profile: Profile, batch: int) -> InterludeScheduler:
    s = object.__new__(InterludeScheduler)
    s.ipolicy = InferCeptPolicy(profile)
    s.iteration = 1
    s.block_size = profile.block_size
    s.swap = None
    s.lot = ParkingLot(profile.block_size, profile.block_bytes)
    s.views = RequestViews(None, s.lot, s.block_size)
    s.prefill_order = PrefillOrder(batch)
    return s


def test_prefill_jobs_go_shortest_first_within_a_batch_and_ahead_of_sessions(
    make_profile: Callable[..., Profile],
) -> None:
    s = scheduler(make_profile(), batch=3)
    queue = PolicyQueue(s._queue_key)
    for r in (session("chat", 10), job("a", 900), job("b", 40), job("c", 300), job("d", 5)):
        queue.add_request(r)
    # a, b, c arrived as one batch: shortest first; d is the next batch's, short as it is, so a
    # long prompt waits behind at most a batch of shorter ones.
    assert [r.request_id for r in queue] == ["b", "c", "a", "d", "chat"]
    # A rescore (policies that re-rank every step) keeps each job's key, and asks the policy
    # only about the session.
    asked: list[int] = []
    policy_keys = s.ipolicy.queue_keys

    def queue_keys(views: list[object], now: float) -> list[tuple[float, ...]]:
        asked.append(len(views))
        return policy_keys(views, now)  # type: ignore[arg-type]

    s.ipolicy.queue_keys = queue_keys  # type: ignore[method-assign]
    keys = s._rescore_keys(list(queue), 0.0)
    assert asked == [1]
    assert keys[:4] == [s.prefill_order.key(r) for r in list(queue)[:4]]
    assert keys[4][0] == 1.0  # the session ranks by its policy, behind


def test_a_forgotten_job_comes_back_in_a_new_batch() -> None:
    order = PrefillOrder(batch=2)
    a = job("a", 10)
    first = order.key(a)
    assert first is not None and order.key(a) == first
    order.forget("a")
    order.key(job("b", 10))
    again = order.key(a)
    assert again is not None and again[1] == 1.0 and order.key(session("s", 10)) is None


def test_queued_prefill_tokens_count_what_is_left_of_prompts() -> None:
    a, b, c = job("a", 100), session("b", 50), session("c", 20)
    a.num_computed_tokens, c.num_computed_tokens = 64, 20
    assert queued_prefill_tokens([a, b, c]) == 36 + 50


def test_the_engine_and_the_simulator_order_prefill_jobs_alike(
    make_profile: Callable[..., Profile],
) -> None:
    """One rule (`policy.prefill_jobs.PrefillBatches`): the engine's keys are the simulator's
    prefill engine's behind the prefill jobs' class."""
    from interlude.policy.prefill_jobs import PrefillJobs
    from interlude.sim.request import SimRequest
    from interlude_workloads import Segment, TraceRequest

    prompts = {"a": 900, "b": 40, "c": 300, "d": 5, "e": 77}
    engine, sim = PrefillOrder(batch=2), PrefillJobs(make_profile(), batch=2)
    for rid, n in prompts.items():
        r = SimRequest(rid, TraceRequest(rid, "chat", n, (Segment(1, None),)), 0.0)
        assert engine.key(job(rid, n)) == (0.5, *sim.queue_key(r, 0.0))
    ranked = sorted(prompts, key=lambda rid: engine.key(job(rid, prompts[rid])) or ())
    assert ranked == ["b", "a", "d", "c", "e"]
