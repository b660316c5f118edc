"""`interlude bench placement` results: the table and the plot, pure functions over the JSON
`run_placement` writes (bench/placement.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from interlude.bench.placement import summary
from interlude.bench.report import save_figure


def _cell(value: tuple[float, float, float], fmt: str) -> str:
    med, lo, hi = value
    return f"{med:{fmt}} ({lo:{fmt}}-{hi:{fmt}})"


def markdown_rows(result: dict[str, Any]) -> list[str]:
    """One row per (rate, rule): medians over rounds, the range in brackets."""
    lines = [
        "| rate | rule | light requests' p99 JCT (s) | p99 time per output token (ms) "
        "| p99 JCT (s) | preemptions | unfinished |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in summary(result):
        lines.append(
            f"| {row['rate']:g} | {row['rule']} | {_cell(row['light_jct_p99_s'], '.2f')} "
            f"| {_cell(row['tpot_p99_ms'], '.1f')} | {_cell(row['jct_p99_s'], '.1f')} "
            f"| {_cell(row['preemptions'], '.0f')} | {row['unfinished'][0]:.0f} |"
        )
    return lines


def plot_placement(result: dict[str, Any], path: Path) -> None:
    """Light requests' p99 JCT and p99 time per token against rate, a line per rule (medians
    over rounds, the range shaded)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary(result)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, (key, label) in zip(
        axes,
        (("light_jct_p99_s", "light requests' p99 JCT (s)"), ("tpot_p99_ms", "p99 ms per token")),
        strict=True,
    ):
        for i, rule in enumerate(result["rules"]):
            mine = [r for r in rows if r["rule"] == rule]
            rates = [r["rate"] for r in mine]
            ax.plot(rates, [r[key][0] for r in mine], "o-", color=f"C{i}", label=rule)
            ax.fill_between(
                rates,
                [r[key][1] for r in mine],
                [r[key][2] for r in mine],
                color=f"C{i}",
                alpha=0.15,
            )
        ax.set_xlabel("requests/s")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    spec = result["spec"]
    title = (
        f"Decode placement, {spec['engines']} engines of {result['profile']}, "
        f"{spec['heavy_share']:.0%} heavy, predictor {spec['accuracy']:.0%} accurate"
    )
    save_figure(fig, title, path)
