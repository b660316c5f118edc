"""What the engine's scheduler reports beside vLLM's own stats: the parking lot's counters and
the pools' state, under `swap.STATS_KEY` of `SchedulerStats.kv_connector_stats` (the one
free-form field vLLM carries from the engine core to the front end's stat loggers)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from interlude.enginecore.prefill_order import queued_prefill_tokens

if TYPE_CHECKING:
    from interlude.enginecore.scheduler import InterludeScheduler


def scheduler_payload(s: InterludeScheduler) -> dict[str, Any]:
    """The payload of `InterludeScheduler` `s` (read only)."""
    pool = s.kv_cache_manager.block_pool
    return s.lot.counters.as_dict() | {
        "free_gpu_blocks": pool.get_num_free_blocks(),
        "total_gpu_blocks": pool.num_gpu_blocks,
        "gpu_kv_gb": pool.num_gpu_blocks * s.lot.block_bytes / 1e9,
        "parked_requests": len(s.lot.parked),
        "held_request_steps": s.held_request_steps,
        "policy_errors": s.policy_errors,
        "host_slots_free": s.swap.free_slots if s.swap else 0,
        "swap_in_steps": s.swap.load_steps if s.swap else 0,
        "turn_starts": s.moves.turn_starts(),
        "queued_prefill_tokens": queued_prefill_tokens((*s.waiting, *s.running)),
    }
