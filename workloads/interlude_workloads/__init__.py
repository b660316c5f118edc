"""Interlude's workload library: augmented-request workloads and their arrival schedules.

Workloads come from InferCept's shared trace (`load_trace`, `default_trace_path`) or from
`generate`, which samples DESIGN section 4's table; `poisson_arrivals` turns a pool into a
timed schedule for the simulator, the real engine or the gateway alike; `load_jsonl` reads
user traces (one conversation per line, `userjsonl`). Standard library only, so every other
component can depend on it. The HTTP load generator, which is not (httpx, rich, matplotlib),
is the package `interlude.loadgen` (`interlude loadgen run | compare`).
"""

from interlude_workloads.arrivals import GENERATED_POOL_SIZE, poisson_arrivals, resolve_workload
from interlude_workloads.generate import (
    AUGMENTATIONS,
    MAX_CONTEXT,
    PROFILES,
    WORKLOADS,
    AugmentationProfile,
    generate,
)
from interlude_workloads.trace import (
    CHARS_PER_TOKEN,
    TraceError,
    classify,
    default_trace_path,
    estimate_tokens,
    load_trace,
    parse_trace,
)
from interlude_workloads.types import Arrival, Segment, TraceCall, TraceRequest
from interlude_workloads.userjsonl import UserTrace, load_jsonl, parse_jsonl

__all__ = [
    "AUGMENTATIONS",
    "CHARS_PER_TOKEN",
    "GENERATED_POOL_SIZE",
    "MAX_CONTEXT",
    "PROFILES",
    "WORKLOADS",
    "Arrival",
    "AugmentationProfile",
    "Segment",
    "TraceCall",
    "TraceError",
    "TraceRequest",
    "UserTrace",
    "classify",
    "default_trace_path",
    "estimate_tokens",
    "generate",
    "load_jsonl",
    "load_trace",
    "parse_jsonl",
    "parse_trace",
    "poisson_arrivals",
    "resolve_workload",
]
