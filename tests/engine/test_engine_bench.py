"""`interlude bench engine`: a small real run of two arms, and the summary, ratios and plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from interlude.bench.engine_bench import EngineBenchSpec, run_engine_bench
from interlude.bench.engine_report import plot_engine, ratios, summarize_runs


def row(arm: str, fps: float, lat: float, run: int = 0) -> dict[str, Any]:
    return {
        "arm": arm,
        "run": run,
        "sessions": 10,
        "finished": fps * 10,
        "finished_per_s": fps,
        "median_norm_latency_s": lat,
        "ttft_mean_s": 1.0,
        "ttft_p99_s": 2.0,
        "recomputed_tokens": 100,
        "prefix_cache_hit_rate": 0.5,
        "kv_waste_gb_s": 0.0,
    }


def test_summary_keeps_every_run_and_ratios_use_the_means() -> None:
    rows = [row("vllm-prefix", 4.0, 0.3), row("interlude", 7.0, 0.01)]
    rows += [row("vllm-prefix", 2.0, 0.5, 1), row("interlude", 8.0, 0.03, 1)]
    summary = summarize_runs(rows)
    assert [r["arm"] for r in summary] == ["vllm-prefix", "interlude"]
    stock, ours = summary
    assert stock["runs"] == 2 and stock["finished_per_s"] == pytest.approx(3.0)
    assert stock["finished_per_s_range"] == (2.0, 4.0)
    assert ours["median_norm_latency_s"] == pytest.approx(0.02)
    got = ratios(summary)
    assert set(got) == {"vllm-prefix"}  # no no-prefix arm ran
    assert got["vllm-prefix"] == {"ratio": pytest.approx(7.5 / 3.0), "target": 1.5}
    assert ratios(summary[:1]) == {}  # without our arm there is nothing to compare


def test_plot_writes_a_png(tmp_path: Path) -> None:
    spec = {"num_gpu_blocks": 40, "rate": 16.0, "duration_s": 30.0}
    rows = [row("vllm-prefix", 4.0, 0.3), row("vllm-noprefix", 3.5, 0.4), row("interlude", 7, 0.01)]
    out = tmp_path / "plots" / "engine.png"
    plot_engine({"spec": spec, "rows": rows}, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.engine
def test_small_run_compares_stock_and_ours(tiny_model: str) -> None:
    spec = EngineBenchSpec(
        model=tiny_model, workload="generated:mixed", rate=2.0, duration_s=3.0, horizon_s=60.0
    )
    lines: list[str] = []
    result = run_engine_bench(spec, ["vllm-prefix", "interlude"], lines.append)
    stock, ours = result["rows"]
    assert stock["sessions"] == ours["sessions"] > 0  # the same arrivals for both arms
    # Light load and a long horizon: every session finishes in both arms.
    assert stock["finished"] == stock["sessions"] and ours["finished"] == ours["sessions"]
    assert stock["prefix_cache_hit_rate"] > 0  # resubmitted contexts hit the prefix cache
    assert set(result["ratios"]) == {"vllm-prefix"}
    assert any("[2/2] interlude (run 1/1)" in line for line in lines)
