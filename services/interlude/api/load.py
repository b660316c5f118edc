"""An engine's load (`GET /v1/load`) as it is measured and read: one rule for the engine, the
gateway's placement, the operator's flips and the simulator's cluster (`sim/cluster.py`), so
they measure and place alike."""

from __future__ import annotations

import time
from collections import deque


class RecentRate:
    """A cumulative counter's rate over a sliding window of (time, total) samples, per unit of
    `scale`: the contended waste (GB·s per second per GB of the pool) and the busy share
    (busy seconds per second). A counter that stopped growing reads as falling to 0 as the
    window passes. Side effects: keeps the samples."""

    def __init__(self, window_s: float = 30.0) -> None:
        self.window_s = window_s
        self.samples: deque[tuple[float, float]] = deque()

    def update(self, total: float, scale: float = 1.0, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        self.samples.append((now, total))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window_s:
            self.samples.popleft()
        (t0, w0), (t1, w1) = self.samples[0], self.samples[-1]
        if t1 <= t0 or scale <= 0:
            return 0.0
        return max(0.0, (w1 - w0) / (t1 - t0) / scale)


def placement_score(
    kv_usage: float, contended_waste: float, waiting: float, max_num_seqs: float
) -> float:
    """Lower is better: the share of KV in use, the waste held while others wait, and the
    queue per sequence slot, so neither a full engine nor a waiting queue attracts more work."""
    return kv_usage + contended_waste + waiting / max(1.0, max_num_seqs)
