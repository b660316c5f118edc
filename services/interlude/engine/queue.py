"""A vLLM `RequestQueue` ordered by the policy's `queue_key`, asked once per entry."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator

from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.request import Request

Key = Callable[[Request], tuple[float, ...]]


class PolicyQueue(RequestQueue):
    """Heap of (key, entry order, request). `prepend_*` re-enters with the same key: a ranked
    queue has no front, and vLLM only prepends requests it skipped or preempted."""

    def __init__(self, key: Key) -> None:
        self._key = key
        self._heap: list[tuple[tuple[float, ...], int, Request]] = []
        self._order = itertools.count()

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, (self._key(request), next(self._order), request))

    def pop_request(self) -> Request:
        if not self._heap:
            raise IndexError("pop from an empty PolicyQueue")
        return heapq.heappop(self._heap)[2]

    def peek_request(self) -> Request:
        if not self._heap:
            raise IndexError("peek into an empty PolicyQueue")
        return self._heap[0][2]

    def prepend_request(self, request: Request) -> None:
        self.add_request(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        for r in requests:
            self.add_request(r)

    def remove_request(self, request: Request) -> None:
        self.remove_requests((request,))

    def remove_requests(self, requests: Iterable[Request]) -> None:
        drop = {id(r) for r in requests}
        self._heap = [e for e in self._heap if id(e[2]) not in drop]
        heapq.heapify(self._heap)

    def rekey(self, request_ids: set[str]) -> None:
        """Ask the key again for the named requests (a policy's `Decision.requeue`)."""
        self._heap = [
            (self._key(e[2]), e[1], e[2]) if e[2].request_id in request_ids else e
            for e in self._heap
        ]
        heapq.heapify(self._heap)

    def __contains__(self, request: object) -> bool:
        return any(e[2] is request for e in self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return iter([e[2] for e in sorted(self._heap)])
