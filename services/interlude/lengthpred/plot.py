"""The evaluation as grouped bars: accuracy per granularity, predictor beside its baselines."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from interlude.lengthpred.evaluate import Row


def accuracy_bars(rows: Sequence[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [
        ("predictor", [r.accuracy for r in rows]),
        ("most common bucket", [r.majority for r in rows]),
        ("kind's most common", [r.kind_majority for r in rows]),
        ("kind's mean (policies today)", [r.kind_mean for r in rows]),
        ("TetriInfer (paper)", [r.paper or 0.0 for r in rows]),
    ]
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(11, 4.5))
    for i, (label, values) in enumerate(series):
        xs = [j + (i - len(series) / 2 + 0.5) * width for j in range(len(rows))]
        ax.bar(xs, values, width, label=label)
    ax.set_xticks(range(len(rows)), [f"{r.granularity} ({r.buckets} buckets)" for r in rows])
    ax.set_xlabel("bucket granularity, tokens")
    ax.set_ylabel(f"accuracy on {rows[0].held_out} held-out segments")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_title("Output-length bucket from the prompt (the shared trace's text segments)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
