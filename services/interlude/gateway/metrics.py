"""The gateway's Prometheus metrics (`GET /metrics`), named like the engine's `interlude:*`."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

REQUESTS = Counter(
    "interlude:gateway_requests", "Chat-completion requests by outcome", ["status", "stream"]
)
LATENCY = Histogram(
    "interlude:gateway_request_seconds", "Seconds from request to last byte", buckets=_LATENCY
)
TTFT = Histogram(
    "interlude:gateway_ttft_seconds", "Seconds from request to first content", buckets=_LATENCY
)
TOKENS = Counter("interlude:gateway_tokens", "Tokens by kind (prompt, completion)", ["kind"])
ROUTES = Counter(
    "interlude:gateway_routes",
    "Where requests went: new (power of two choices), resume (affinity), fallback (recompute)",
    ["decision"],
)
FALLBACKS = Counter(
    "interlude:gateway_fallbacks",
    "Requests served by recompute although a paused session was expected, by reason",
    ["reason"],
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
STORE_ERRORS = Counter(
    "interlude:gateway_store_errors",
    "Redis calls that failed (session store, rate limits); the gateway degraded instead of failing",
)
