"""The engine's speed as `/v1/load` reports it (`itl_ms`, engine/metrics.py): the median of
recent inter-token latencies, and none once the engine has generated nothing for a while."""

from __future__ import annotations

from vllm.v1.metrics.stats import IterationStats

from interlude.engine.metrics import ITL_MIN_SAMPLES, ITL_WINDOW_S, InterludeStatLogger


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
