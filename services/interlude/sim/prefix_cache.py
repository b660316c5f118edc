"""vLLM's prefix cache over the simulator's free GPU blocks: what a request freed stays there,
to be found again, until allocations reuse the blocks, least recently freed first.

vLLM 0.32 (`v1/core/block_pool.py`) keeps every free block in one queue: a request's freed
blocks join its tail, last block first (so a request loses its tail before its head), and an
allocation takes blocks from its head, evicting what they cached. A waiting request that
computed its context once (preempted, or discarded at a pause) finds the leading blocks of it
still cached and computes only the rest (one swapped out whole loads only the rest); the engine
counts such a resume as `prefix-cache` (`enginecore/moves.py`). Only whole blocks are cached,
and a hit leaves at least one token to compute (vLLM's `num_tokens - 1` cap), so the request
samples.

The simulator counts blocks (`KVBook.gpu_free`, moved by several parts of a step), so the cache
follows it lazily: `sync` evicts from the queue's head whatever the free count has lost since
the last look. A free marks the blocks as the newest (`freed`); a hit takes a request's own
blocks out of the queue wherever they are (`hit`).

Invariant after `sync(free)`: the queue holds exactly `free` blocks, and each request's cached
blocks are the leading blocks of its context.
"""

from __future__ import annotations

from collections import deque


class Segment:
    """Consecutive free blocks in the queue: `owner`'s cached leading blocks, or blocks no
    request will find again (owner None: a partial block, a finished request's).

    An owner's segment may have `later` ones: the blocks after its own, freed after it (a copy
    to host in pieces, `freed_piece`). They stand behind it in the queue, so they are evicted
    only once it is gone; while it is whole (`blocks == size`) they extend what the owner
    finds, and once it lost its last block they are found by nobody."""

    __slots__ = ("blocks", "later", "later_of", "owner", "size")

    def __init__(self, owner: str | None, blocks: int, later_of: str | None = None) -> None:
        self.owner = owner
        self.blocks = blocks
        self.size = blocks
        self.later: list[Segment] = []
        self.later_of = later_of  # the owner this is a later piece of (never merged into)

    def reachable(self) -> int:
        """Blocks its owner finds: its own, and the later ones while its own are whole."""
        if self.blocks < self.size:
            return self.blocks
        return self.blocks + sum(s.blocks for s in self.later)


class PrefixCache:
    """The free-block queue of one engine. Disabled, it holds nothing and finds nothing."""

    def __init__(self, total_blocks: int, enabled: bool) -> None:
        self.enabled = enabled
        self.queue: deque[Segment] = deque()
        self.queued = 0  # blocks in `queue`
        self.cached: dict[str, Segment] = {}  # owner -> its segment
        if enabled:
            self.queue.append(Segment(None, total_blocks))
            self.queued = total_blocks

    def sync(self, free: int) -> None:
        """The engine has `free` blocks now: evict from the head what allocations took, and
        queue, as the newest, blocks that came back without a `freed` (a reservation's)."""
        if not self.enabled or self.queued == free:
            return
        if self.queued < free:
            self._append(None, free - self.queued)
            return
        excess = self.queued - free
        while excess:
            head = self.queue[0]
            n = min(head.blocks, excess)
            head.blocks -= n
            excess -= n
            self.queued -= n
            if head.blocks == 0:
                self.queue.popleft()
                if head.owner is not None:
                    self._unlink(self.cached.pop(head.owner))

    def freed(self, free_before: int, owner: str, tokens: int, blocks: int, bs: int) -> None:
        """`owner` freed `blocks` GPU blocks holding the first `tokens` tokens of its context
        (all it held); `free_before`: the free count before they came back."""
        if not self.enabled:
            return
        self.sync(free_before)
        self.forget(owner)
        whole = tokens // bs
        if blocks > whole:
            self._append(None, blocks - whole)  # the partial last block: never cached
        if whole:
            self._append(owner, whole)

    def freed_piece(self, free_before: int, owner: str, blocks: int, first: bool) -> None:
        """`owner` freed its next `blocks` whole blocks after copying them to host, in order
        from its first (the engine frees a copied piece at once, the request's last piece with
        the request); `first`: this piece starts its context."""
        if not self.enabled or blocks <= 0:
            return
        self.sync(free_before)
        if first:
            self.forget(owner)
            self._append(owner, blocks)
            return
        head = self.cached.get(owner)
        if head is None or head.blocks < head.size:
            self._append(None, blocks)  # behind a gap: nobody finds them
            return
        later = Segment(None, blocks, later_of=owner)
        self.queue.append(later)  # its own segment, to be taken from at the owner's hit
        self.queued += blocks
        head.later.append(later)

    def freed_anonymous(self, free_before: int, blocks: int) -> None:
        """Blocks came back that nobody will find again (a finished request's, a partial
        drop's, a copy to host of a context partly discarded before)."""
        if not self.enabled or blocks <= 0:
            return
        self.sync(free_before)
        self._append(None, blocks)

    def lookup(self, owner: str, pending: int, free: int, bs: int) -> int:
        """Tokens `owner` (holding no KV, `pending` tokens to compute) finds cached while
        `free` blocks are free."""
        if not self.enabled or owner not in self.cached:
            return 0
        self.sync(free)
        seg = self.cached.get(owner)
        return 0 if seg is None else min(seg.reachable(), (pending - 1) // bs) * bs

    def hit(self, owner: str, tokens: int, bs: int) -> None:
        """`owner` takes its first `tokens` tokens (whole blocks, from a `lookup` just before)
        out of the queue; its other cached blocks are no longer reachable."""
        seg = self.cached.pop(owner)
        taken = tokens // bs
        self.queued -= taken
        for s in (seg, *seg.later):
            n = min(s.blocks, taken)
            s.blocks -= n
            taken -= n
        self._unlink(seg)

    def forget(self, owner: str) -> None:
        """`owner`'s cached blocks can no longer be found (it left, or freed again)."""
        seg = self.cached.pop(owner, None)
        if seg is not None:
            self._unlink(seg)

    @staticmethod
    def _unlink(seg: Segment) -> None:
        """`seg` and its later pieces are nobody's now."""
        for later in seg.later:
            later.later_of = None
        seg.owner, seg.later = None, []

    def _append(self, owner: str | None, blocks: int) -> None:
        tail = self.queue[-1] if self.queue else None
        if owner is None and tail is not None and tail.owner is None and tail.later_of is None:
            tail.blocks += blocks
        else:
            seg = Segment(owner, blocks)
            self.queue.append(seg)
            if owner is not None:
                self.cached[owner] = seg
        self.queued += blocks

    def check(self, free: int) -> str | None:
        """What breaks the invariant with `free` blocks free, or None."""
        if not self.enabled:
            return None
        self.sync(free)
        total = sum(s.blocks for s in self.queue)
        if total != self.queued or self.queued != free:
            return f"prefix cache queues {total} blocks (counted {self.queued}), {free} are free"
        owners = {s.owner: s for s in self.queue if s.owner is not None}
        if owners != self.cached or any(s.blocks <= 0 for s in owners.values()):
            return f"prefix cache owners {sorted(owners)} != {sorted(self.cached)}"
        return None
