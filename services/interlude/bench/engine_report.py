"""`interlude bench engine` results: repeated runs summarized per arm, the ratios the issue asks
for, the table and the plot. Pure functions over the JSON `run_engine_bench` writes.

Runs of the same arm differ (timing noise on a shared CPU decides which sessions finish by the
horizon), so every run is kept and the summary reports the mean and the range.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from interlude.bench.report import save_figure
from interlude.sim.metrics import mean

# Metrics the summary reports as mean and range over an arm's runs.
SUMMARIZED = ("finished_per_s", "median_norm_latency_s", "ttft_mean_s", "ttft_p99_s")
# The targets: our `interlude` arm against each stock arm, in finished requests/s.
TARGETS = {"vllm-prefix": 1.5, "vllm-noprefix": 2.0}
OURS = "interlude"


def summarize_runs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per arm (first-seen order): mean, min and max of each summarized metric over
    the arm's runs, plus the mean of the counters."""
    arms: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        arms.setdefault(r["arm"], []).append(r)
    out = []
    for arm, runs in arms.items():
        row: dict[str, Any] = {"arm": arm, "runs": len(runs), "sessions": runs[0]["sessions"]}
        for key in SUMMARIZED:
            values = [r[key] for r in runs]
            row[key] = mean(values)
            row[f"{key}_range"] = (min(values), max(values))
        for key in ("finished", "recomputed_tokens", "prefix_cache_hit_rate", "kv_waste_gb_s"):
            row[key] = mean([float(r[key]) for r in runs])
        out.append(row)
    return out


def ratios(summary: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """`interlude`'s mean finished/s over each stock arm's, with the issue's target."""
    by_arm = {r["arm"]: r for r in summary}
    if OURS not in by_arm:
        return {}
    ours = by_arm[OURS]["finished_per_s"]
    return {
        stock: {"ratio": ours / by_arm[stock]["finished_per_s"], "target": target}
        for stock, target in TARGETS.items()
        if stock in by_arm and by_arm[stock]["finished_per_s"] > 0
    }


def plot_engine(result: dict[str, Any], path: Path) -> None:
    """Finished/s and median normalized latency per arm: bars are means, dots single runs;
    dashed lines mark the throughput `interlude` must reach for each target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summarize_runs(result["rows"])
    names = [r["arm"] for r in summary]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    panels = (
        ("finished_per_s", "finished sessions / s (higher is better)", False),
        ("median_norm_latency_s", "median normalized latency, s/token (lower is better)", True),
    )
    for ax, (key, label, log) in zip(axes, panels, strict=True):
        colors = ["tab:gray" if n.startswith("vllm") else "tab:blue" for n in names]
        ax.bar(names, [r[key] for r in summary], color=colors, alpha=0.7)
        for i, name in enumerate(names):
            runs = [r[key] for r in result["rows"] if r["arm"] == name]
            ax.plot([i] * len(runs), runs, "k.", ms=6)
        ax.set_ylabel(label)
        if log:
            ax.set_yscale("log")
        ax.tick_params(axis="x", rotation=20)
        ax.grid(axis="y", alpha=0.3)
    by_arm = {r["arm"]: r for r in summary}
    for stock, target in TARGETS.items():
        if stock in by_arm:
            need = target * by_arm[stock]["finished_per_s"]
            axes[0].axhline(need, ls="--", lw=1, color="tab:red")
            axes[0].annotate(f"{target:g}x {stock}", (0, need), fontsize=8, va="bottom")
    spec = result["spec"]
    title = (
        f"real engine, {spec['num_gpu_blocks']} KV blocks, {spec['rate']:g} sessions/s for "
        f"{spec['duration_s']:g} s, {max(r['runs'] for r in summary)} run(s) per arm"
    )
    save_figure(fig, title, path)


def sweep_lines(result: dict[str, Any]) -> list[str]:
    """The sweep's answer in words: per round the SLO and each arm's sustainable rates, then
    `interlude`'s ratios over each stock arm with their range over the rounds."""
    lines = []
    for k, r in enumerate(result["rounds"]):
        rates = ", ".join(
            f"{arm} {_rate(v['median'])} / {_rate(v['tail'])}"
            for arm, v in r["sustainable"].items()
        )
        lines.append(
            f"round {k + 1}: SLO {r['slo_s_per_token'] * 1e3:.1f} ms/token; "
            f"sustainable sessions/s (median / tail): {rates}"
        )
    for stock, entry in result["ratios"].items():
        for rule in ("median", "tail"):
            e = entry[rule]
            if e is None:
                lines.append(f"{OURS} / {stock} ({rule}): no ratio (a rate below the sweep)")
                continue
            lo, hi = e["range"]
            lines.append(
                f"{OURS} / {stock} ({rule} rule): {statistics.median(e['rounds']):.2f}x median "
                f"of rounds (mean {e['mean']:.2f}x, rounds {lo:.2f}-{hi:.2f}x, "
                f"target {TARGETS.get(stock, 0):g}x)"
            )
    return lines


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def plot_engine_sweep(result: dict[str, Any], path: Path) -> None:
    """Median and p99 normalized latency against the arrival rate, one line per arm and round,
    with the round's SLO (dashed) and the tail bound (dotted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from interlude.slo import TAIL_FACTOR

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), sharex=True)
    arms = list(dict.fromkeys(r["arm"] for r in result["rows"]))
    colors = {arm: f"C{i}" for i, arm in enumerate(arms)}
    for k, rnd in enumerate(result["rounds"]):
        for ax, key, bound in (
            (axes[0], "median_norm_latency_s", rnd["slo_s_per_token"]),
            (axes[1], "p99_norm_latency_s", TAIL_FACTOR * rnd["slo_s_per_token"]),
        ):
            for arm in arms:
                pts = sorted(
                    (r["rate"], r[key]) for r in result["rows"] if r["run"] == k and r["arm"] == arm
                )
                if pts:
                    xs, ys = zip(*pts, strict=True)
                    ax.plot(
                        xs,
                        ys,
                        "o-",
                        color=colors[arm],
                        alpha=0.8,
                        ms=4,
                        label=arm if k == 0 else None,
                    )
            ax.axhline(bound, ls="--" if key.startswith("median") else ":", lw=1, color="tab:red")
    for ax, label in zip(axes, ("median", "p99"), strict=True):
        ax.set_yscale("log")
        ax.set_xlabel("arrival rate (sessions/s)")
        ax.set_ylabel(f"{label} normalized latency, s/token")
        ax.grid(alpha=0.3)
    axes[0].legend()
    spec = result["spec"]
    title = (
        f"real engine rate sweep, {spec['num_gpu_blocks']} KV blocks, {spec['duration_s']:g} s "
        f"of arrivals, {len(result['rounds'])} round(s); red: SLO (median) and tail bound (p99)"
    )
    save_figure(fig, title, path)
