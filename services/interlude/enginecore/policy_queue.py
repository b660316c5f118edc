"""A vLLM `RequestQueue` ordered by the policy's `queue_key`, asked once per entry (or, for a
policy that re-ranks every iteration, again at each step: `rescore`).

Parked streaming sessions sit in vLLM's `kv_holding_waiting` (they hold blocks) until their next
input comes. vLLM drains that queue first and pops and skips each parked request at every step;
here they carry the `DORMANT` key instead, which sorts last, and the queue reads as empty once
only dormant entries are left (`len` still counts them), so vLLM moves on to `waiting` at once.
A request vLLM pops and skips goes back with the key and entry order it had: the policy is not
asked again and its queue time does not restart. Keys of popped requests live until the next
step (`forget_popped`): a request that comes back later (preempted) is a new entry.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence

from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.request import Request

from interlude.policy.admission import holds_no_kv
from interlude.policy.types import Decision, RequestView

Key = Callable[[Request], tuple[float, ...]]
DORMANT: tuple[float, ...] = (math.inf, math.inf)  # a parked request: not schedulable
Entry = tuple[tuple[float, ...], int, Request]  # (key, entry order, request)


class PolicyQueue(RequestQueue):
    """Heap of (key, entry order, request); lowest key first, ties in entry order."""

    def __init__(self, key: Key) -> None:
        self._key = key
        self._heap: list[Entry] = []
        self._order = itertools.count()
        self._members: set[str] = set()  # request ids in the heap: O(1) `in`
        self._popped: dict[str, tuple[tuple[float, ...], int]] = {}  # this step's pops

    def _push(self, entry: Entry) -> None:
        heapq.heappush(self._heap, entry)
        self._members.add(entry[2].request_id)

    def add_request(self, request: Request) -> None:
        self._popped.pop(request.request_id, None)
        self._push((self._key(request), next(self._order), request))

    def pop_request(self) -> Request:
        if not self._heap:
            raise IndexError("pop from an empty PolicyQueue")
        key, order, request = heapq.heappop(self._heap)
        self._members.discard(request.request_id)
        self._popped[request.request_id] = (key, order)
        return request

    def peek_request(self) -> Request:
        if not self._heap:
            raise IndexError("peek into an empty PolicyQueue")
        return self._heap[0][2]

    def prepend_request(self, request: Request) -> None:
        """Back in with its old key if vLLM popped it this step (skipped), else a new entry."""
        old = self._popped.pop(request.request_id, None)
        if old is None:
            self.add_request(request)
        else:
            self._push((old[0], old[1], request))

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        for r in requests:
            self.prepend_request(r)

    def forget_popped(self) -> None:
        """Start of a step: what was popped before and comes back is a new entry."""
        self._popped.clear()

    def set_aside(self, request_ids: set[str]) -> list[Entry]:
        """Take the named requests out of vLLM's reach for one step (a policy's
        `Decision.hold`), so that it admits the requests behind them; `put_back` after."""
        drop = request_ids & self._members
        if not drop:
            return []
        held = [e for e in self._heap if e[2].request_id in drop]
        self._heap = [e for e in self._heap if e[2].request_id not in drop]
        heapq.heapify(self._heap)
        self._members -= drop
        return held

    def put_back(self, entries: list[Entry]) -> None:
        """Held requests return with their key and entry order: they keep their place."""
        for e in entries:
            self._push(e)

    def remove_request(self, request: Request) -> None:
        self.remove_requests((request,))

    def remove_requests(self, requests: Iterable[Request]) -> None:
        drop = {r.request_id for r in requests} & self._members
        if not drop:
            return  # vLLM removes finished requests from every queue: most are elsewhere
        self._heap = [e for e in self._heap if e[2].request_id not in drop]
        heapq.heapify(self._heap)
        self._members -= drop

    def rekey(self, request_ids: set[str]) -> None:
        """Ask the key again for the named requests (a policy's `Decision.requeue`)."""
        if not request_ids & self._members:
            return
        self._heap = [
            (self._key(e[2]), e[1], e[2]) if e[2].request_id in request_ids else e
            for e in self._heap
        ]
        heapq.heapify(self._heap)

    def rescore(self, keys: Callable[[list[Request]], list[tuple[float, ...]]]) -> None:
        """Rank every schedulable entry again by `keys` (all in one call), keeping its entry
        order for ties (`Traits.rescore_queued`: a policy whose keys follow the batch state).
        Dormant entries stay dormant; `keys` must not restart anyone's queue time."""
        live = [e for e in self._heap if e[0] != DORMANT]
        if not live:
            return
        new = keys([e[2] for e in live])
        rescored = [(k, e[1], e[2]) for k, e in zip(new, live, strict=True)]
        self._heap = [e for e in self._heap if e[0] == DORMANT] + rescored
        heapq.heapify(self._heap)

    def __contains__(self, request: object) -> bool:
        return isinstance(request, Request) and request.request_id in self._members

    def __bool__(self) -> bool:
        """Whether vLLM should look here: dormant entries sort last, so a dormant head means
        nothing else is left."""
        return bool(self._heap) and self._heap[0][0] != DORMANT

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return iter([e[2] for e in sorted(self._heap, key=lambda e: (e[0], e[1]))])


def held_ids(decision: Decision, waiting: Sequence[RequestView]) -> set[str]:
    """The waiting requests (`view.waiting`, in queue order) a decision keeps out of this step.

    `Decision.hold` names them (ids that are not waiting are ignored, as in the simulator);
    `Decision.admit_limit` lets only that many of the others through, from the head, counting
    only requests that hold no GPU KV: a resumed session that kept its KV is never held by the
    limit (the simulator runs it at once; held, it would lock its blocks).
    """
    ids = [v.request_id for v in waiting]
    hold = set(decision.hold).intersection(ids) if decision.hold else set()
    if decision.admit_limit is not None:
        order = [v.request_id for v in waiting if v.request_id not in hold and holds_no_kv(v)]
        hold.update(order[decision.admit_limit :])
    return hold


def ranked(view: RequestView, key: tuple[float, ...]) -> tuple[float, ...]:
    """The policy's key behind a class: a resumed request with a host copy (a swap-in) ranks
    ahead of every request without one, as the simulator swaps in before it admits. vLLM then
    allocates its whole sequence first, or admits nobody behind it (its loop stops at the
    first request it cannot allocate), which is the simulator's swap reserve."""
    return (0.0 if view.cpu_tokens > 0 else 1.0, *key)
