"""Online estimates of what a paused or waiting request will do next, learned per request kind.

Both `lamps` and `interlude` use the same estimator so their comparison is about the policy, not
about who gets better predictions. Nothing is known in advance: estimates start from a prior and
follow the observed calls (the simulator and the engine report them through the policy hooks).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict, deque
from dataclasses import dataclass
from itertools import accumulate


@dataclass(frozen=True)
class PredictorConfig:
    # Samples kept per kind; old ones fall out so the estimate follows a drifting workload.
    window: int = 512
    # Priors used before a kind has any sample (seconds / tokens).
    prior_duration_s: float = 1.0
    prior_segment_tokens: float = 100.0
    # Kinds come from clients (`interlude_kind`); past this many, new ones share OTHER_KIND's
    # statistics, so a client inventing kinds cannot grow the engine's memory without bound.
    max_kinds: int = 64

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError("PredictorConfig.window must be >= 1")
        if self.max_kinds < 1:
            raise ValueError("PredictorConfig.max_kinds must be >= 1")
        if self.prior_duration_s < 0 or self.prior_segment_tokens <= 0:
            raise ValueError("PredictorConfig priors must be positive")


OTHER_KIND = "other"  # the kind every kind past `PredictorConfig.max_kinds` counts as

# Reviews are set just past the point where a decision flips, so that the clock, however it
# was summed, is on the far side of the flip when the policy looks again.
PAST = 1e-9
# Two wastes this close (relative) are equal: a decision at an exact crossing must not depend
# on how the clock was summed (seen on round-numbered test profiles, where preserve and
# discard met exactly at an iteration boundary and float noise picked the side).
TIE = 1e-9


class KindStats:
    """A sliding window of samples with a sorted copy for conditional expectations."""

    def __init__(self, window: int) -> None:
        self._recent: deque[float] = deque(maxlen=window)
        self._sorted: list[float] = []
        self._sum = 0.0
        # Suffix sums of `_sorted`, rebuilt lazily: adds are rare next to queries.
        self._suffix: list[float] | None = None
        # `residual_exceeds_at`'s scan from each start index, kept until the next add: callers
        # ask it for every paused request at every iteration with a new threshold each time.
        self._scans: dict[tuple[int, int], _Scan] = {}

    def add(self, x: float) -> None:
        if len(self._recent) == self._recent.maxlen:
            old = self._recent[0]
            del self._sorted[bisect.bisect_left(self._sorted, old)]
            self._sum -= old
        self._recent.append(x)
        bisect.insort(self._sorted, x)
        self._sum += x
        self._suffix = None
        self._scans.clear()

    def __len__(self) -> int:
        return len(self._recent)

    def mean(self) -> float:
        return self._sum / len(self._recent)

    def fraction_at_most(self, x: float) -> float:
        """Share of the samples <= x."""
        return bisect.bisect_right(self._sorted, x) / len(self._sorted)

    def _suffix_sums(self) -> list[float]:
        """suffix[j] = sum(sorted samples from j on), rebuilt after an add."""
        if self._suffix is None:
            # The same additions as summing from the last sample down (0.0 + x_n + ... ), done
            # by accumulate in C: an add invalidates the sums, and adds come about once per
            # simulator step in a loaded run.
            suffix = list(accumulate(reversed(self._sorted), initial=0.0))
            suffix.reverse()
            self._suffix = suffix
        return self._suffix

    def mean_residual(self, elapsed: float) -> float | None:
        """E[X - elapsed | X > elapsed] over the samples; None when no sample exceeds `elapsed`."""
        suffix = self._suffix_sums()
        i = bisect.bisect_right(self._sorted, elapsed)
        n = len(self._sorted) - i
        if n == 0:
            return None
        return suffix[i] / n - elapsed

    def residual_exceeds_at(self, elapsed: float, threshold: float, scan: int = 32) -> float | None:
        """The next elapsed time >= `elapsed` at which the mean residual may exceed `threshold`.

        E[X - t | X > t] shrinks with t between samples and jumps up as t passes one; beyond
        the last sample the callers use t itself. So the answer is the first sample point past
        which the residual exceeds `threshold`, or `threshold` once past the last sample. After
        `scan` sample points without a crossing we stop and return that point: an early review
        is harmless, a late one is not.
        """
        values = self._sorted
        n = len(values)
        i = bisect.bisect_right(values, elapsed)
        if i >= n:
            return threshold + PAST if threshold > elapsed else None
        state = self._scans.get((i, scan))
        if state is None:
            state = self._scans[i, scan] = _Scan(i)
        # The first sample point whose residual exceeds the threshold: the running maximum of
        # the residuals crosses it there. Points are worked out only as far as a query needs.
        running_max = state.running_max
        m = bisect.bisect_right(running_max, threshold)
        if m < len(running_max):
            return values[i + m] + PAST
        if state.last is None and state.next < min(n, i + scan):
            crossed = self._extend(state, min(n, i + scan), threshold)
            if crossed is not None:
                return values[crossed] + PAST
        if state.last is not None:
            return max(values[state.last], threshold) + PAST
        return values[i + scan - 1] + PAST

    def _extend(self, state: _Scan, stop: int, threshold: float) -> int | None:
        """Scan on from `state.next` (before `stop`) until the running maximum of the residual
        just past each point exceeds `threshold`; return that point, or None. Stops at the
        first point of the largest value (`state.last`), where the tail is empty."""
        values, suffix = self._sorted, self._suffix_sums()
        n = len(values)
        running_max = state.running_max
        best = running_max[-1] if running_max else -math.inf
        for j in range(state.next, stop):
            t = values[j]
            k = j + 1  # samples equal to t leave the tail together: k is past all of them
            if k < n and values[k] == t:
                k = bisect.bisect_right(values, t)
            if k == n:
                state.last, state.next = j, j
                return None
            residual = suffix[k] / (n - k) - t
            if residual > best:
                best = residual
            running_max.append(best)
            if best > threshold:
                state.next = j + 1
                return j
        state.next = stop
        return None


class _Scan:
    """`KindStats.residual_exceeds_at`'s scan from one start index, as far as it went."""

    __slots__ = ("last", "next", "running_max")

    def __init__(self, start: int) -> None:
        self.running_max: list[float] = []  # running maximum of the residuals from `start`
        self.next = start  # the next point to work out
        self.last: int | None = None  # the first point of the largest value, once reached


class Predictor:
    def __init__(self, config: PredictorConfig | None = None) -> None:
        self.config = config or PredictorConfig()
        self._durations: defaultdict[str, KindStats] = defaultdict(self._new)
        self._segments: defaultdict[str, KindStats] = defaultdict(self._new)
        self._returns: defaultdict[str, KindStats] = defaultdict(self._new)
        self._kinds: set[str] = set()

    def _new(self) -> KindStats:
        return KindStats(self.config.window)

    def _admit(self, kind: str) -> str:
        """A kind not seen before: itself, or OTHER_KIND once `max_kinds` others are known
        (lookups too, so a kind is read where it is written)."""
        if len(self._kinds) < self.config.max_kinds:
            self._kinds.add(kind)
            return kind
        return OTHER_KIND

    def observe_duration(self, kind: str, seconds: float) -> None:
        if kind not in self._kinds:  # a set lookup: this runs on every prediction
            kind = self._admit(kind)
        self._durations[kind].add(seconds)

    def observe_segment(self, kind: str, tokens: int) -> None:
        if kind not in self._kinds:  # a set lookup: this runs on every prediction
            kind = self._admit(kind)
        self._segments[kind].add(float(tokens))

    def observe_return(self, kind: str, tokens: int) -> None:
        """A call of this kind returned `tokens` tokens (appended to the context)."""
        if kind not in self._kinds:  # a set lookup: this runs on every prediction
            kind = self._admit(kind)
        self._returns[kind].add(float(tokens))

    def duration(self, kind: str) -> float:
        if kind not in self._kinds:  # a set lookup: this runs on every prediction
            kind = self._admit(kind)
        s = self._durations.get(kind)
        return s.mean() if s else self.config.prior_duration_s

    def segment_tokens(self, kind: str) -> float:
        if kind not in self._kinds:  # a set lookup: this runs on every prediction
            kind = self._admit(kind)
        s = self._segments.get(kind)
        return s.mean() if s else self.config.prior_segment_tokens

    def return_tokens(self, kind: str) -> float:
        """Mean tokens a call of this kind returns (0.0 before any is seen)."""
        if kind not in self._kinds:  # a set lookup: this runs on every prediction
            kind = self._admit(kind)
        s = self._returns.get(kind)
        return s.mean() if s else 0.0

    def fraction_within(self, kind: str, seconds: float) -> float:
        """Share of this kind's observed calls that lasted at most `seconds` (without samples:
        1.0 if the prior duration does, else 0.0)."""
        if kind not in self._kinds:  # a set lookup: this runs on every prediction
            kind = self._admit(kind)
        s = self._durations.get(kind)
        if not s:
            return 1.0 if self.config.prior_duration_s <= seconds else 0.0
        return s.fraction_at_most(seconds)

    def remaining_duration(self, kind: str, elapsed: float) -> float:
        """Expected time until a call of this kind returns, given it has run `elapsed` seconds.

        Without samples, or once the call outlives every sample, fall back to `elapsed` itself
        (InferCept's t_now - t_call estimate: a call that has run long tends to run longer).
        """
        if kind not in self._kinds:  # a set lookup: this runs on every prediction
            kind = self._admit(kind)
        s = self._durations.get(kind)
        if not s:
            return elapsed
        r = s.mean_residual(elapsed)
        return elapsed if r is None else r

    def residual_rises_at(self, kind: str, elapsed: float, threshold: float) -> float | None:
        """The next elapsed time at which `remaining_duration` may exceed `threshold`.

        Between samples the residual only shrinks; it can grow past `threshold` where a sample
        is passed, or, beyond the last sample (where it equals the elapsed time), when the
        elapsed time itself reaches `threshold`.
        """
        if kind not in self._kinds:  # a set lookup: this runs on every prediction
            kind = self._admit(kind)
        s = self._durations.get(kind)
        if not s:
            return threshold + PAST if threshold > elapsed else None
        return s.residual_exceeds_at(elapsed, threshold)
