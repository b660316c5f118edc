"""The gateway's Prometheus metrics (`GET /metrics`), named like the engine's `interlude:*`.
What happens inside a chat completion (resumes, fallbacks, tokens, TTFT) is the engine's to
count (`engine/completions/metrics.py`): the gateway does not read the answers it relays."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

REQUESTS = Counter(
    "interlude:gateway_requests", "Chat-completion requests by outcome", ["status", "stream"]
)
LATENCY = Histogram(
    "interlude:gateway_request_seconds", "Seconds from request to last byte", buckets=_LATENCY
)
ROUTES = Counter(
    "interlude:gateway_routes",
    "Where requests went: affinity (the engine its tool results name), affinity_lost (that "
    "engine is gone), balanced (power of two choices), retry (an engine was unreachable), "
    "prefill (a new session on a decode engine, its prompt sent to a prefill engine)",
    ["decision"],
)
PAUSED = Gauge(
    "interlude:gateway_paused_sessions",
    "Sessions parked on the engines, by KV strategy (summed from the engines' load)",
    ["strategy"],
)
ENGINES = Gauge("interlude:gateway_engines", "Engines in the pool by readiness", ["ready"])
DISCONNECTS = Counter(
    "interlude:gateway_client_disconnects", "Clients that went away before their answer"
)
BROKEN_STREAMS = Counter(
    "interlude:gateway_broken_streams",
    "Engine streams that ended before their [DONE]; the client got an error frame instead",
)
STORE_ERRORS = Counter(
    "interlude:gateway_store_errors",
    "Redis calls that failed (rate limits); the gateway degraded instead of failing",
)
