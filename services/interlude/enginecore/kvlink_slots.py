"""The scheduler side of the KV link's arena (kvlink_segment.py): which slots hold which
segment, and when a decode engine is done with them.

A writer hands a segment over by creating an empty *marker* file next to its arena. A reader
claims it by renaming the marker to `<marker>.taken` (atomic: of a reader and the writer's
expiry, exactly one wins) and releases it by unlinking that name once its workers have copied
the blocks. The writer frees a segment's slots when neither name is left, or expires an
unclaimed marker after `ttl_s` by unlinking it itself (a reader that comes later finds nothing
and prefills the prompt), or a claim after `4 x ttl_s` (its reader died). Slots are handed out
first-fit as one run per segment, so a segment is one contiguous copy.

No locks: the writer's scheduler alone allocates, each marker has one owner at a time, and the
arena's stamps catch a reader that copies after its segment was expired and reused.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass

from interlude.enginecore.kvlink_segment import unlink

TAKEN = ".taken"
CLAIM_TTL_FACTOR = 4  # a claim older than this many TTLs belongs to a reader that died


class Slots:
    """First-fit allocator of `capacity` arena slots in runs."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"an arena needs at least one slot, not {capacity}")
        self.capacity = capacity
        self._free: list[tuple[int, int]] = [(0, capacity)]  # (start, length), sorted

    @property
    def free(self) -> int:
        return sum(n for _, n in self._free)

    def take(self, n: int) -> int | None:
        """The start of a run of `n` free slots, now taken; None when no run is that long."""
        for i, (start, length) in enumerate(self._free):
            if length >= n:
                if length == n:
                    del self._free[i]
                else:
                    self._free[i] = (start + n, length - n)
                return start
        return None

    def give(self, start: int, n: int) -> None:
        """Return slots start..start+n (taken before), merging neighbouring runs."""
        i = bisect.bisect(self._free, (start, n))
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == start:
            i -= 1
            start, n = self._free[i][0], self._free[i][1] + n
            del self._free[i]
        if i < len(self._free) and start + n == self._free[i][0]:
            n += self._free[i][1]
            del self._free[i]
        self._free.insert(i, (start, n))


@dataclass
class Held:
    start: int
    blocks: int
    published_at: float | None = None  # None: written, not yet handed over


class Handoffs:
    """The writer's segments: planned, published (marker made) and taken back."""

    def __init__(self, directory: str, prefix: str, capacity: int, ttl_s: float) -> None:
        self.directory, self.prefix, self.ttl_s = directory, prefix, ttl_s
        self.slots = Slots(capacity)
        self.held: dict[int, Held] = {}
        self._seq = 0
        self.expired = 0  # markers nobody claimed within the TTL

    def marker(self, seq: int) -> str:
        return os.path.join(self.directory, f"{self.prefix}{seq}")

    def plan(self, blocks: int, now: float) -> tuple[int, int] | None:
        """(sequence number, first slot) of a new segment of `blocks` slots; None when the arena
        has no room even after taking back what readers are done with."""
        start = self.slots.take(blocks)
        if start is None:
            self.reclaim(now)
            start = self.slots.take(blocks)
        if start is None:
            return None
        self._seq += 1
        self.held[self._seq] = Held(start, blocks)
        return self._seq, start

    def publish(self, seq: int, now: float) -> str:
        """Make the segment's marker: from now a decode engine may claim it."""
        path = self.marker(seq)
        with open(path, "wb"):
            pass
        self.held[seq].published_at = now
        return path

    def drop(self, seq: int) -> None:
        """Take back a segment that was never published (its request ended first)."""
        held = self.held.pop(seq, None)
        if held is not None:
            self.slots.give(held.start, held.blocks)

    def reclaim(self, now: float) -> int:
        """Free the slots of segments whose readers are done, or that expired; how many."""
        freed = 0
        for seq, held in list(self.held.items()):
            if held.published_at is None:
                continue
            if self._done_with(seq, now - held.published_at):
                del self.held[seq]
                self.slots.give(held.start, held.blocks)
                freed += 1
        return freed

    def _done_with(self, seq: int, age: float) -> bool:
        path = self.marker(seq)
        if os.path.exists(path):
            if age <= self.ttl_s:
                return False
            try:
                os.unlink(path)  # a reader renaming it now fails, and prefills instead
            except FileNotFoundError:
                return False  # claimed just now
            self.expired += 1
            return True
        if os.path.exists(path + TAKEN):
            if age <= CLAIM_TTL_FACTOR * self.ttl_s:
                return False
            unlink(path + TAKEN)
        return True

    def close(self) -> None:
        """Withdraw every unclaimed marker (the arena goes with this engine)."""
        for seq in self.held:
            unlink(self.marker(seq))
        self.held.clear()


def claim(marker: str) -> bool:
    """A reader's claim of a segment: False when it expired or another reader has it."""
    try:
        os.rename(marker, marker + TAKEN)
    except FileNotFoundError:
        return False
    return True


def release(marker: str) -> None:
    unlink(marker + TAKEN)
