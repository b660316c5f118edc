"""Chat-completion metrics of an engine's OpenAI route (`GET /metrics`, beside vLLM's and the
scheduler's): what users asked, how it was routed, and how long it took."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

REQUESTS = Counter(
    "interlude:chat_requests", "Chat-completion requests by outcome", ["status", "stream"]
)
LATENCY = Histogram(
    "interlude:chat_request_seconds", "Seconds from request to last byte", buckets=_LATENCY
)
TTFT = Histogram(
    "interlude:chat_ttft_seconds", "Seconds from request to first content", buckets=_LATENCY
)
TOKENS = Counter("interlude:chat_tokens", "Tokens by kind (prompt, completion)", ["kind"])
ROUTES = Counter(
    "interlude:chat_routes",
    "How requests were served: new, resume (the paused session), fallback (recompute)",
    ["decision"],
)
FALLBACKS = Counter(
    "interlude:chat_fallbacks",
    "Requests served by recompute although a paused session was expected, by reason",
    ["reason"],
)
DISCONNECTS = Counter(
    "interlude:chat_client_disconnects", "Clients that went away before their answer"
)
