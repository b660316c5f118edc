"""The engine's stat logger (engine/metrics.py): its speed as `/v1/load` reports it (`itl_ms`,
the median of recent inter-token latencies, none once the engine has generated nothing for a
while), and how the scheduler's counters reach Prometheus and not vLLM's log."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from prometheus_client import REGISTRY
from vllm.v1.metrics.stats import IterationStats

from interlude.engine.metrics import ITL_MIN_SAMPLES, ITL_WINDOW_S, InterludeStatLogger
from interlude.enginecore.swap import STATS_KEY


def iteration(*itls_s: float) -> IterationStats:
    stats = IterationStats()
    stats.inter_token_latencies_iter = list(itls_s)
    return stats


def test_the_median_of_recent_gaps_ignores_a_tool_calls_pause() -> None:
    stats = InterludeStatLogger(vllm_config=None)
    assert stats.snapshot()["itl_ms"] == 0.0  # nothing generated yet: no speed
    n = ITL_MIN_SAMPLES // 3 + 1
    stats.record(None, iteration(*[0.004] * n, *[0.005] * n, *[0.006] * n))
    stats.record(None, iteration(30.0))  # a turn resumed after a 30 s tool call
    assert stats.snapshot()["itl_ms"] == 5.0


def test_a_handful_of_gaps_reports_no_speed() -> None:
    """One short answer's gaps are noise: no figure until the window holds enough of them."""
    stats = InterludeStatLogger(vllm_config=None)
    stats.record(None, iteration(*[0.005] * (ITL_MIN_SAMPLES - 1)))
    assert stats.snapshot()["itl_ms"] == 0.0
    stats.record(None, iteration(0.005))
    assert stats.snapshot()["itl_ms"] == 5.0


def test_an_engine_idle_past_the_window_reports_no_speed() -> None:
    """A figure measured under an old load would keep sessions away from an engine that can
    only show it is fast again by getting one."""
    stats = InterludeStatLogger(vllm_config=None)
    stats.record(None, iteration(*[0.2] * ITL_MIN_SAMPLES))
    when = stats._itls[0][0]
    assert stats._itl_ms(when + ITL_WINDOW_S / 2) == 200.0
    assert stats._itl_ms(when + ITL_WINDOW_S + 0.1) == 0.0


def test_prompt_tokens_are_counted_by_where_their_kv_came_from() -> None:
    """A decode engine's prompts come over the host link; `/v1/load`'s snapshot and Prometheus
    count them apart from those computed or found in the prefix cache."""
    stats = InterludeStatLogger(vllm_config=None)
    step = iteration()
    tokens = step.prompt_token_stats
    tokens.computed, tokens.local_cache_hit, tokens.external_kv_transfer = 5, 64, 900
    stats.record(None, step)
    stats.record(None, step)
    assert stats.snapshot()["prompt_tokens"] == {
        "computed": 10,
        "local_cache_hit": 128,
        "external_kv_transfer": 1800,
    }


def scheduler_step(
    waste_gb_s: float, steps: int, waits: int = 0, turn_starts: dict[str, Any] | None = None
) -> SimpleNamespace:
    """A `SchedulerStats` carrying our scheduler's cumulative counters, as the core sends it."""
    data = {
        "paused": {"preserve": 1},
        "waste_gb_s": waste_gb_s,
        "waste_contended_gb_s": 0.0,
        "resumed_tokens": 0,
        "used_gb_s": 2 * waste_gb_s,
        "recompute_tokens": {},
        "swap_bytes": {},
        "interceptions": {},
        "resume_wait_s": {"preserve": 0.001 * waits},
        "resume_waits": {"preserve": waits},
        "turn_starts": turn_starts or {},
        "vllm_s": 0.0,
        "step_s": 0.0,
        "steps": steps,
    }
    return SimpleNamespace(
        prefix_cache_stats=SimpleNamespace(queries=0, hits=0),
        kv_connector_stats={STATS_KEY: data},
        kv_cache_usage=0.5,
        num_running_reqs=1,
        num_waiting_reqs=0,
    )


def test_scheduler_counters_reach_prometheus_when_read_not_on_every_step() -> None:
    """Mirroring the counters was the logger's largest per-step cost on the loop that streams
    tokens: a step within `MIRROR_S` of the last mirror only keeps them; `mirror` (which
    `/metrics` calls) brings the metrics to the latest cumulative values, losing nothing."""
    stats = InterludeStatLogger(vllm_config=None)

    def steps_total() -> float:
        return REGISTRY.get_sample_value("interlude:scheduler_steps_total") or 0.0

    before = steps_total()
    stats.record(scheduler_step(1.0, 10), None)  # the first step mirrors at once
    assert steps_total() == before + 10
    for n in range(11, 60):
        stats.record(scheduler_step(1.0 + n, n), None)
    assert steps_total() == before + 10  # kept, not yet mirrored
    stats.mirror()
    assert steps_total() == before + 59
    assert REGISTRY.get_sample_value("interlude:kv_waste_ratio") == 0.5


def test_vllms_logger_takes_our_counters_as_nothing_to_log() -> None:
    """Our counters ride in `kv_connector_stats` to reach this logger; vLLM's logging stat
    logger reads the same field every step and, without a stats class from the connector,
    warns every step that there is none. It now folds them into stats that log nothing."""
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorLogging

    from interlude.engine.config import register_connectors

    register_connectors()
    logging_ = KVConnectorLogging(KVTransferConfig(kv_connector=STATS_KEY, kv_role="kv_both"))
    payload = scheduler_step(1.0, 1).kv_connector_stats
    logging_.observe(payload)
    logging_.observe(payload)
    built = logging_.transfer_stats_accumulator
    assert built is not None and built.is_empty() and built.reduce() == {}


def test_each_resumed_turns_wait_reaches_the_histogram_with_its_count() -> None:
    """`resume_start_seconds` (one by one) and `resume_waits` (counted) move together, so their
    counts agree whenever Prometheus reads them, and a mirror on shutdown loses neither."""
    stats = InterludeStatLogger(vllm_config=None)

    def counts() -> tuple[float, float]:
        via = {"via": "preserve"}
        observed = REGISTRY.get_sample_value("interlude:resume_start_seconds_count", via)
        waits = REGISTRY.get_sample_value("interlude:resume_waits_total", via)
        return observed or 0.0, waits or 0.0

    stats.record(scheduler_step(1.0, 1), None)  # mirrored at once: the first step
    before = counts()
    for n in range(1, 6):
        stats.record(scheduler_step(1.0, 1 + n, n, {f"s{n}": ("preserve", 0.001)}), None)
    assert counts() == before  # neither yet: the last mirror was under MIRROR_S ago
    stats.mirror()
    assert counts() == (before[0] + 5, before[1] + 5)
