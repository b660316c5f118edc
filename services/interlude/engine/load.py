"""`GET /v1/load`: what the gateway routes on, as cheap JSON (no Prometheus text to parse).

The numbers come from the scheduler's last step (`VllmEngine.stats()`); two are rates over the last
30 s (`api.load.RecentRate`): the contended waste, GB·s of GPU KV held by paused requests while
others waited, per second and per GB of the engine's KV pool (0 = no waste paid for, 1 = the
whole pool), and the busy share, the time spent in steps that computed tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from interlude.api.load import RecentRate


def load_report(
    stats: Mapping[str, Any],
    rate: RecentRate,
    busy: RecentRate,
    *,
    engine_id: str,
    model: str,
    ready: bool,
    max_model_len: int,
    max_num_seqs: int,
    sessions: Mapping[str, int],
    role: str = "mixed",
) -> dict[str, Any]:
    recompute = dict(stats.get("recompute_tokens") or {})
    return {
        "engine_id": engine_id,
        "model": model,
        "ready": ready,
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "kv_usage": float(stats.get("kv_cache_usage", 0.0)),
        "running": int(stats.get("num_running", 0)),
        "waiting": int(stats.get("num_waiting", 0)),
        "sessions": dict(sessions),
        "paused": dict(stats.get("paused") or {}),
        "resumes": dict(stats.get("resumes") or {}),
        "contended_waste": rate.update(
            float(stats.get("waste_contended_gb_s", 0.0)), float(stats.get("gpu_kv_gb", 0.0))
        ),
        "waste_gb_s": float(stats.get("waste_gb_s", 0.0)),
        "waste_contended_gb_s": float(stats.get("waste_contended_gb_s", 0.0)),
        "resumed_context_tokens": int(stats.get("resumed_tokens", 0)),
        "recompute_tokens": sum(int(n) for n in recompute.values()),
        "recompute_tokens_by_reason": recompute,
        # How fast this engine generates now (the median gap between a request's tokens over
        # its last few hundred; 0 = none yet): the gateway's placement prefers the faster.
        "itl_ms": float(stats.get("itl_ms", 0.0)),
        # The share of the last 30 s the engine spent in steps that computed tokens (0..1):
        # how idle it is, for role flips (`policy.flips`).
        "busy_share": min(1.0, busy.update(float(stats.get("busy_s", 0.0)))),
        # Prefill and decode roles (`api.engine.ENGINE_ROLES`): the gateway sends a prefill engine
        # no session, and picks among prefill engines by the prompt tokens they have queued.
        "role": role,
        "queued_prefill_tokens": int(stats.get("queued_prefill_tokens", 0)),
    }
