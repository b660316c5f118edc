"""The picker's Prometheus metrics (`GET /metrics` on its metrics port), named like the
gateway's `interlude:gateway_*`: what it chose and refused, how long a choice took, and what it
sees of the engines. What happens to a request after the choice is the engines' to count."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_PICK = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)

PICKS = Counter(
    "interlude:picker_picks",
    "Requests routed, by how: affinity (the engine its tool results name), affinity_lost (that "
    "engine is gone: recomputed elsewhere), balanced (power of two choices), prefill (a new "
    "session on a decode engine, its prompt sent to a prefill engine), any (no body: any engine)",
    ["route"],
)
REFUSALS = Counter(
    "interlude:picker_refusals",
    "Requests answered by the picker itself, by HTTP status (400 bad body, 401 no caller, "
    "404 unknown model or path, 405 wrong method, 413 too large, 429 shedding, 503 no engine "
    "ready)",
    ["status"],
)
PICK_SECONDS = Histogram(
    "interlude:picker_pick_seconds",
    "Seconds from a request's last body byte (its headers, without one) to the picker's answer",
    buckets=_PICK,
)
ENGINES = Gauge("interlude:picker_engines", "Engines the picker sees, by readiness", ["ready"])
STREAMS = Gauge("interlude:picker_streams", "Open ext_proc streams (requests in the proxy)")
