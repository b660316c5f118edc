"""Arrival schedules: which request enters when, and where the request pool comes from.

InferCept's evaluation (DESIGN section 4) drives the server with Poisson arrivals whose requests
are drawn uniformly, with replacement, from the workload; a run is then characterised by its
rate alone. Drawing with replacement lets a 1800 s run at a high rate use a pool of a few
hundred requests; `Arrival.arrival_id` keeps the repeats apart.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path

from interlude_workloads.generate import WORKLOADS, generate
from interlude_workloads.trace import TRACE_ENV, default_trace_path, load_trace
from interlude_workloads.types import Arrival, TraceRequest

GENERATED_POOL_SIZE = 400  # about the shared trace's 397 requests
_SPEC_HELP = "a trace JSON path, 'shared', or 'generated:NAME' with NAME one of " + ", ".join(
    WORKLOADS
)


def _positive(name: str, value: float) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def poisson_arrivals(
    pool: Sequence[TraceRequest], rate: float, duration_s: float, seed: int
) -> list[Arrival]:
    """Poisson arrivals at `rate` per second over [0, duration_s), requests drawn from `pool`.

    Inter-arrival gaps are exponential with mean 1/rate; each arrival picks a pool entry
    uniformly with replacement. One `random.Random(seed)` drives both, so the same arguments
    give the same schedule. Arrival ids are f"{index}:{request_id}".
    """
    _positive("rate", rate)
    _positive("duration_s", duration_s)
    if not pool:
        raise ValueError("the request pool is empty")
    rng = random.Random(seed)
    out: list[Arrival] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return out
        request = pool[rng.randrange(len(pool))]
        out.append(Arrival(t, request, f"{len(out)}:{request.request_id}"))


def resolve_workload(spec: str, seed: int) -> list[TraceRequest]:
    """The request pool a workload spec names.

    * "shared": the InferCept trace at `default_trace_path()` (error if this checkout lacks it);
    * "generated:NAME": `generate(NAME, 400, seed)`;
    * anything else: a path to a trace JSON file.
    """
    if spec == "shared":
        path = default_trace_path()
        if path is None:
            raise ValueError(
                "the shared InferCept trace was not found (looked for ../shared/data/ next to"
                f" the repository root, or ${TRACE_ENV}); use 'generated:mixed' instead"
            )
        return load_trace(path)
    if spec.startswith("generated:"):
        name = spec.removeprefix("generated:")
        if name not in WORKLOADS:
            raise ValueError(
                f"unknown generated workload {name!r} in {spec!r}; expected {_SPEC_HELP}"
            )
        return generate(name, GENERATED_POOL_SIZE, seed)
    if not spec or not Path(spec).is_file():
        raise ValueError(f"workload {spec!r} is not a file; expected {_SPEC_HELP}")
    return load_trace(spec)
