"""LAMPS's starvation guard, shared by `lamps` and `interlude`.

A queued request that has been scheduled once counts one per iteration it waits; at the
threshold it is promoted to the head of the queue and stays ahead of unpromoted requests (in
promotion order) until it finishes. Counting uses iteration numbers, so engines that skip
identical iterations still count them.
"""

from __future__ import annotations

import heapq

from interlude.policy.types import Phase, RequestView

STARVATION_THRESHOLD = 100  # iterations, as in the LAMPS paper


class StarvationGuard:
    def __init__(self, threshold: int = STARVATION_THRESHOLD) -> None:
        if threshold < 1:
            raise ValueError("starvation threshold must be >= 1 iteration")
        self.threshold = threshold
        # (iteration due, tie-break, queue entry time, request): a wait that may starve.
        self._due: list[tuple[int, int, float, RequestView]] = []
        self._seq = 0
        self._promoted: dict[str, int] = {}  # request -> promotion order
        # request -> queue entry (time, iteration) already counted: a queue key may be asked
        # again while the request waits (policies that re-rank every iteration); a wait is
        # counted once.
        self._counted: dict[str, tuple[float, int]] = {}

    def on_queued(self, r: RequestView) -> None:
        """`r` is in the waiting queue: start counting if it has run before (once per entry)."""
        entry = (r.queue_time, r.queue_iteration)
        if self._counted.get(r.request_id) == entry:
            return
        self._counted[r.request_id] = entry
        if r.scheduled_once and r.request_id not in self._promoted:
            self._seq += 1
            due = r.queue_iteration + self.threshold
            heapq.heappush(self._due, (due, self._seq, r.queue_time, r))

    def update(self, iteration: int) -> tuple[tuple[str, ...], int | None]:
        """Promote the waits that reached the threshold.

        Returns the newly promoted ids and the next iteration at which one may be promoted.
        """
        promoted = []
        while self._due and self._due[0][0] <= iteration:
            _, _, entered, r = heapq.heappop(self._due)
            still_waiting = r.phase is Phase.WAITING and r.queue_time == entered
            if still_waiting and r.request_id not in self._promoted:
                self._promoted[r.request_id] = len(self._promoted) + 1
                promoted.append(r.request_id)
        return tuple(promoted), (self._due[0][0] if self._due else None)

    @property
    def any_promoted(self) -> bool:
        """Whether some request is promoted now."""
        return bool(self._promoted)

    def promotion(self, request_id: str) -> int | None:
        """Promotion order of a promoted request, None if it is not promoted."""
        return self._promoted.get(request_id)

    def forget(self, request_id: str) -> None:
        self._promoted.pop(request_id, None)
        self._counted.pop(request_id, None)
