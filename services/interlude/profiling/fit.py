"""The pure math of `interlude profile`: the T_fwd fit and the saturation point.

No engine, no torch: `profiler.py` measures points, these functions turn them into numbers, and
the unit tests check them on synthetic points.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    """One measured iteration shape: `tokens` scheduled in an iteration that took `ms`."""

    family: str  # how it was produced: "decode", "packed" (many short prefills), "lone" prefill
    tokens: int
    ms: float

    def __post_init__(self) -> None:
        if self.tokens < 1:
            raise ValueError(f"Point.tokens must be >= 1, got {self.tokens}")
        if not (self.ms > 0 and math.isfinite(self.ms)):
            raise ValueError(f"Point.ms must be > 0 and finite, got {self.ms}")

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.ms * 1000.0


@dataclass(frozen=True)
class LinearFit:
    """T(n) = a*n + c in ms, fitted by least squares, and how well it fits."""

    a_ms: float
    c_ms: float
    # 1 - SS_res/SS_tot of the times themselves (unweighted), clamped to [0, 1]: with relative
    # weighting the line is not the one that maximises it, and can even fall below the mean.
    r2: float
    rms_rel_err: float  # root mean square of (fit - measured) / measured over the points
    points: int
    relative: bool  # weighted by 1/T^2, i.e. relative errors minimised (see fit_linear)
    constrained: bool = False  # True when the unconstrained fit had a < 0 or c < 0

    def at(self, tokens: float) -> float:
        return self.a_ms * tokens + self.c_ms


def median_points(samples: Iterable[Point]) -> list[Point]:
    """One point per (family, tokens): the median of its repetitions, which shrugs off the odd
    iteration slowed by another process on shared cores (a mean would not)."""
    groups: dict[tuple[str, int], list[float]] = {}
    for p in samples:
        groups.setdefault((p.family, p.tokens), []).append(p.ms)
    return [Point(f, n, statistics.median(ms)) for (f, n), ms in sorted(groups.items())]


def fit_linear(points: Sequence[Point], relative: bool = True) -> LinearFit:
    """Least-squares T = a*n + c over `points`, keeping a >= 0 and c >= 0 (a Profile's domain).

    `relative` (the default) minimises the sum of squared *relative* errors, sum(((T - fit) /
    T)^2), i.e. weights each point by 1/T^2; otherwise plain absolute errors. Why relative: the
    measured iterations span ~4 ms decodes to ~200 ms long prefills, and plain least squares
    weighs a 200 ms point like 2500 four-millisecond ones; where the line cannot follow all of
    them (long prefills grow faster than linearly on CPU: attention), it sacrifices the small
    iterations that serving is mostly made of. On points exactly on a line both give that line.

    If the optimum leaves the domain (noise on nearly flat data), the best fit on its boundary
    is returned instead: a = 0 (c = weighted mean time) or c = 0 (a line through the origin),
    and `constrained` says so. Raises ValueError with fewer than two distinct token counts.
    """
    if len({p.tokens for p in points}) < 2:
        raise ValueError("fit_linear needs points at two or more distinct token counts")
    xs = [float(p.tokens) for p in points]
    ys = [p.ms for p in points]
    ws = [1.0 / (y * y) if relative else 1.0 for y in ys]
    sw = math.fsum(ws)
    mx = math.fsum(w * x for w, x in zip(ws, xs, strict=True)) / sw
    my = math.fsum(w * y for w, y in zip(ws, ys, strict=True)) / sw
    sxx = math.fsum(w * (x - mx) ** 2 for w, x in zip(ws, xs, strict=True))
    sxy = math.fsum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, ys, strict=True))
    a, c = sxy / sxx, my - sxy / sxx * mx
    constrained = a < 0 or c < 0
    if a < 0:
        a, c = 0.0, my
    elif c < 0:
        num = math.fsum(w * x * y for w, x, y in zip(ws, xs, ys, strict=True))
        a, c = num / math.fsum(w * x * x for w, x in zip(ws, xs, strict=True)), 0.0
    fitted = [a * x + c for x in xs]
    mean = statistics.fmean(ys)
    ss_tot = math.fsum((y - mean) ** 2 for y in ys)
    ss_res = math.fsum((y - f) ** 2 for y, f in zip(ys, fitted, strict=True))
    # All times equal: nothing to explain; a perfect fit explains it all.
    r2 = (1.0 if ss_res == 0 else 0.0) if ss_tot == 0 else 1.0 - ss_res / ss_tot
    rel = math.sqrt(statistics.fmean(((f - y) / y) ** 2 for y, f in zip(ys, fitted, strict=True)))
    # Rounding can push an exact fit a hair past 1.
    return LinearFit(a, c, min(1.0, max(0.0, r2)), rel, len(points), relative, constrained)


def saturation_point(points: Sequence[Point], fraction: float = 0.9) -> int:
    """S: the smallest measured token count whose throughput (tokens/s) reaches `fraction` of
    the highest throughput measured at any token count.

    Beyond S, packing more tokens into an iteration buys at most 1/fraction - 1 (11% at 0.9)
    more throughput. S is a measured count, so it is only as fine as the ladder of counts that
    was measured, and it cannot exceed the largest one: if throughput still rises at the end of
    the ladder, S is where the ladder (the engine's token budget or KV pool) ran out of room.
    Raises ValueError on no points or a fraction outside (0, 1].
    """
    if not points:
        raise ValueError("saturation_point needs at least one point")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    best = max(p.tokens_per_s for p in points)
    return min(p.tokens for p in points if p.tokens_per_s >= fraction * best)


def fit_knee(fit: LinearFit, fraction: float = 0.9) -> float:
    """Token count at which the fitted line's throughput n/T(n) reaches `fraction` of its limit
    1/a: n = fraction/(1-fraction) * c/a (9 c/a at 0.9); infinite when a = 0. Reported beside S
    as a cross-check; S itself comes from measurements (`saturation_point`)."""
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    if fit.a_ms == 0:
        return math.inf
    return fraction / (1 - fraction) * fit.c_ms / fit.a_ms
