"""What `interlude bench toolbus` prints and plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

P50_TARGET_MS, P99_TARGET_MS = 1.0, 5.0


def lines(result: dict[str, Any]) -> list[str]:
    """One line per latency rate, the throughput and the floor, plain text."""
    out = [
        f"{row['rate_per_s']:g} calls/s: p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms, "
        f"p99.9 {row['p99.9_ms']:.2f} ms, max {row['max_ms']:.1f} ms "
        f"({row['calls']} calls, {row['failed']} failed)"
        for row in result["latency"]
    ]
    thr = result["throughput"]
    out.append(
        f"throughput with {result['workers']} workers: {thr['max_calls_per_s']:.0f} calls/s "
        f"({thr['answered']} answered, {thr['failed']} failed, {thr['callers']} callers)"
    )
    floor = result["floor"]
    out.append(
        f"floor (two bare stream hops between two processes): p50 {floor['p50_ms']:.2f} ms, "
        f"p99 {floor['p99_ms']:.2f} ms"
    )
    return out


def plot(result: dict[str, Any], out: Path) -> None:
    """Left: the distribution of round trips at each rate, with the floor and the targets.
    Right: p50 and p99 against the offered rate, and the measured maximum rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from interlude.bench.report import save_figure

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for row in result["latency"]:
        ms = row["quantiles_ms"]
        left.plot(ms, np.linspace(0, 1, len(ms)), label=f"{row['rate_per_s']:g} calls/s")
    left.axvline(result["floor"]["p50_ms"], c="k", lw=0.8, label="floor p50 (bare hops)")
    left.axvline(P50_TARGET_MS, ls="--", c="gray", lw=0.8, label="p50 target")
    left.axvline(P99_TARGET_MS, ls=":", c="gray", lw=0.8, label="p99 target")
    left.set(xscale="log", xlabel="round trip (ms)", ylabel="fraction of calls")
    left.set_title("engine → calculator → engine", fontsize=10)
    left.legend(fontsize=8)
    rates = [row["rate_per_s"] for row in result["latency"]]
    right.plot(rates, [row["p50_ms"] for row in result["latency"]], "-o", label="p50")
    right.plot(rates, [row["p99_ms"] for row in result["latency"]], "-s", label="p99")
    right.axvline(
        result["max_calls_per_s"], c="r", lw=0.8, label=f"max {result['max_calls_per_s']:.0f}/s"
    )
    right.axhline(P50_TARGET_MS, ls="--", c="gray", lw=0.8)
    right.axhline(P99_TARGET_MS, ls=":", c="gray", lw=0.8)
    right.set(xlabel="offered calls/s", ylabel="ms", ylim=(0, None))
    right.set_title(f"{result['workers']} workers, {result['machine']}", fontsize=10)
    right.legend(fontsize=8)
    save_figure(fig, "tool bus round trip (loopback)", out)
