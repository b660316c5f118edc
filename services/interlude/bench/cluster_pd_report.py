"""`interlude bench pd` results: the table and the plot, pure functions over the JSON `run_pd`
writes (bench/cluster_pd.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from interlude.bench.cluster_pd import CLASSES, best_rows, summary
from interlude.bench.report import save_figure


def markdown_rows(result: dict[str, Any]) -> list[str]:
    lines = [
        "| class | load | mixed: TTFT p99 (s) / job p99 (s) / ms per token p99 "
        "| best split | split: TTFT p99 / job p99 / ms per token p99 |",
        "|---|---|---|---|---|",
    ]
    for row in best_rows(result):
        m, d = row["mixed"], row["pd"]
        lines.append(
            f"| {row['class']} | {row['load']:.0%} "
            f"| {m['ttft_p99_s']:.3f} / {m['jct_p99_s']:.2f} / {m['tpot_p99_ms']:.1f} "
            f"| {row['best_split']} "
            f"| {d['ttft_p99_s']:.3f} / {d['jct_p99_s']:.2f} / {d['tpot_p99_ms']:.1f} |"
        )
    return lines


def plot_pd(result: dict[str, Any], path: Path) -> None:
    """Per class: p99 job time against load, a line per split (medians over rounds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jct = summary(result, "jct_p99_s")
    splits = list(dict.fromkeys(r["split"] for r in result["rows"]))
    fig, axes = plt.subplots(1, len(CLASSES), figsize=(4.2 * len(CLASSES), 3.8))
    for ax, klass in zip(axes, CLASSES, strict=True):
        loads = sorted({k[1] for k in jct if k[0] == klass})
        for i, split in enumerate(splits):
            style = "k--" if split == "mixed" else f"C{i}-"
            ax.plot(loads, [jct[klass, x, split] for x in loads], style, marker="o", label=split)
        ax.set_yscale("log")
        ax.set_title(klass)
        ax.set_xlabel("offered load (share of capacity)")
        ax.set_ylabel("p99 job time (s)")
        ax.grid(alpha=0.3)
    axes[0].legend()
    spec = result["spec"]
    title = f"Prefill/decode splits against mixed, {spec['engines']} engines of {result['profile']}"
    save_figure(fig, title, path)
