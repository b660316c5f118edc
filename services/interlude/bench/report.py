"""Tables and plots of a sweep result (the JSON that `run_sweep` returns)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table


def _at(result: dict[str, Any], policy: str, rate: float) -> dict[str, Any]:
    points = result["policies"][policy]["points"]
    return min(points, key=lambda p: abs(p["rate"] - rate))


def report_rate(result: dict[str, Any]) -> float:
    """Default rate for the detail table: infercept's sustainable rate, else the highest."""
    pols = result["policies"]
    r = pols.get("infercept", {}).get("sustainable_rate")
    return float(r) if r is not None else max(result["rates"])


def summary_table(result: dict[str, Any], rate: float) -> Table:
    slo = result["slo_normalized_latency"]
    t = Table(
        title=(
            f"{result['profile']} on {result['workload']}, {result['duration_s']:.0f} s per "
            f"rate; SLO = {slo * 1000:.1f} ms/token normalized latency; details at {rate:g} req/s"
        )
    )
    for col in (
        "policy",
        "sustainable req/s",
        "x vllm",
        "norm. lat. p50 (ms/tok)",
        "throughput req/s",
        "TTFT mean / p99 (s)",
        "e2e mean / p99 (s)",
        "KV waste",
        "recompute share",
    ):
        t.add_column(col, justify="right")
    base = result["policies"].get("vllm", {}).get("sustainable_rate")
    for name, entry in result["policies"].items():
        s = entry["sustainable_rate"]
        ratio = f"{s / base:.2f}" if s and base else "-"
        pt = _at(result, name, rate)
        t.add_row(
            name,
            f"{s:g}" if s is not None else "none",
            ratio,
            f"{pt['normalized_latency_median'] * 1000:.1f}",
            f"{pt['throughput_rps']:.2f}",
            f"{pt['ttft_mean']:.2f} / {pt['ttft_p99']:.2f}",
            f"{pt['e2e_mean']:.1f} / {pt['e2e_p99']:.1f}",
            f"{pt['waste_fraction'] * 100:.2f} %",
            f"{pt['recompute_fraction'] * 100:.1f} %",
        )
    return t


def markdown_table(result: dict[str, Any], rate: float) -> str:
    """The same table as Markdown, for the README."""
    table = summary_table(result, rate)
    headers = [str(c.header) for c in table.columns]
    rows = [list(map(str, c.cells)) for c in table.columns]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for i in range(len(rows[0])):
        lines.append("| " + " | ".join(col[i] for col in rows) + " |")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    """Normalized latency, throughput and TTFT against rate for every policy (paper Fig. 2)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    panels = (
        ("normalized_latency_median", "median normalized latency (s/token)", True),
        ("throughput_rps", "throughput (finished req/s)", False),
        ("ttft_mean", "mean TTFT (s)", True),
    )
    for ax, (key, label, log) in zip(axes, panels, strict=True):
        for name, entry in result["policies"].items():
            pts = entry["points"]
            style = {"linewidth": 2.6} if name == "interlude" else {"linewidth": 1.4}
            ax.plot(
                [p["rate"] for p in pts],
                [p[key] for p in pts],
                marker="o",
                ms=3,
                label=name,
                **style,
            )
        ax.set_xlabel("arrival rate (req/s)")
        ax.set_ylabel(label)
        if log:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].axhline(result["slo_normalized_latency"], color="k", ls="--", lw=1, label="SLO")
    axes[0].legend(fontsize=8)
    title = f"{result['profile']} - {result['workload']} - {result['duration_s']:.0f} s per rate"
    save_figure(fig, f"{title}, seed {result['seed']}", path)


def save_figure(fig: Any, title: str, path: Path) -> None:
    """Title, lay out and write a figure (creating the folder), then release it."""
    import matplotlib.pyplot as plt

    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
