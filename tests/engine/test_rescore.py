"""InterludeScheduler's key for a request asked again while it waits (no engine started).

`_queue_key` is the key of a queue entry and records the entry's time; `_rescore_keys` asks the
same policy keys at a later step (`Traits.rescore_queued`) and must leave that time alone, or
every re-ranking would restart the request's wait (and the starvation guard's count).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from vllm import SamplingParams
from vllm.v1.request import Request

from interlude.enginecore.parking import ParkingLot
from interlude.enginecore.prefill_order import PrefillOrder
from interlude.enginecore.request_views import RequestViews
from interlude.enginecore.scheduler import InterludeScheduler
from interlude.policy import Profile, RequestView
from interlude.policy.lamps import LampsPolicy


class Recording(LampsPolicy):
    def __init__(self, profile: Profile) -> None:
        super().__init__(profile)
        self.seen: list[RequestView] = []

    def queue_keys(self, reqs: Sequence[RequestView], now: float) -> list[tuple[float, ...]]:
        self.seen.extend(reqs)  # `queue_key` comes here too
        return super().queue_keys(reqs, now)


def bare_scheduler(policy: Recording) -> InterludeScheduler:
    """The scheduler's key machinery, without vLLM's engine behind it."""
    p = policy.profile
    s = object.__new__(InterludeScheduler)
    s.ipolicy = policy
    s.iteration = 3
    s.block_size = p.block_size
    s.swap = None
    s.lot = ParkingLot(p.block_size, p.block_bytes)
    s.views = RequestViews(None, s.lot, s.block_size)
    s.prefill_order = PrefillOrder()
    return s


def test_rescore_key_keeps_the_queue_entry(make_profile: Callable[..., Profile]) -> None:
    policy = Recording(make_profile())
    s = bare_scheduler(policy)
    r = Request("r", list(range(40)), SamplingParams(max_tokens=4), None)
    first = s._queue_key(r)
    entered = s.views.entered["r"]
    assert entered[1] == 3
    s.iteration = 9
    [again] = s._rescore_keys([r], entered[0] + 5.0)
    assert s.views.entered["r"] == entered  # the wait did not restart
    assert again == first  # same request, same (empty) batch: same rank
    assert [(v.queue_time, v.queue_iteration) for v in policy.seen] == [entered, entered]
    assert policy.seen[-1].oracle_gen_tokens is None  # the engine knows no trace
    # `_queue_key`, by contrast, is a new entry: asked now, it restarts the wait.
    s._queue_key(r)
    assert s.views.entered["r"][1] == 9
