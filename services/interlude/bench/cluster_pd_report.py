"""`interlude bench pd` results: tables and plots, pure functions over the JSON that
`run_pd` (TetriInfer's classes) or `run_agents` (an agent workload) writes (bench/cluster_pd.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from interlude.bench.cluster_pd import CLASSES, best_rows, summary
from interlude.bench.report import save_figure


def is_agents(result: dict[str, Any]) -> bool:
    return "workload" in result


def markdown_rows(result: dict[str, Any]) -> list[str]:
    if is_agents(result):
        return agent_rows(result)
    lines = [
        "| class | load | mixed: TTFT p99 (s) / job p99 (s) / ms per token p99 "
        "| best split | split: TTFT p99 / job p99 / ms per token p99 |",
        "|---|---|---|---|---|",
    ]
    for row in best_rows(result):
        m, d = row["mixed"], row["pd"]
        lines.append(
            f"| {row['class']} | {row['load']:.0%} "
            f"| {m['ttft_p99_s']:.3f} / {m['jct_p99_s']:.2f} / {m['norm_p99_ms']:.1f} "
            f"| {row['best_split']} "
            f"| {d['ttft_p99_s']:.3f} / {d['jct_p99_s']:.2f} / {d['norm_p99_ms']:.1f} |"
        )
    return lines


AGENT_KEYS = (
    ("norm_p50_ms", "ms/token p50", ".1f"),
    ("norm_p99_ms", "ms/token p99", ".1f"),
    ("ttft_p99_s", "TTFT p99 (s)", ".3f"),
    ("resume_wait_p99_s", "resume wait p99 (s)", ".3f"),
    ("recomputed_tokens", "tokens recomputed", ".3g"),
    ("unfinished", "unfinished", ".0f"),
)


def agent_rows(result: dict[str, Any]) -> list[str]:
    """Per rate and split, the medians over rounds."""
    med = {k: summary(result, k, ("rate",)) for k, _, _ in AGENT_KEYS}
    lines = [
        "| rate (req/s) | split | " + " | ".join(h for _, h, _ in AGENT_KEYS) + " |",
        "|---" * (2 + len(AGENT_KEYS)) + "|",
    ]
    for rate, split in dict.fromkeys((r["rate"], r["split"]) for r in result["rows"]):
        cells = [format(med[k][rate, split], f) for k, _, f in AGENT_KEYS]
        lines.append(f"| {rate:g} | {split} | " + " | ".join(cells) + " |")
    return lines


def plot_pd(result: dict[str, Any], path: Path) -> None:
    """Classes: per class, p99 job time against load, a line per split. Agents: p99 ms per
    token and p99 resume wait against rate, a line per split. Medians over rounds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = result["spec"]
    splits = list(dict.fromkeys(r["split"] for r in result["rows"]))
    if is_agents(result):
        panels = [("norm_p99_ms", "p99 ms per token"), ("resume_wait_p99_s", "p99 resume wait (s)")]
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, (key, label) in zip(axes, panels, strict=True):
            med = summary(result, key, ("rate",))
            rates = sorted({k[0] for k in med})
            for i, split in enumerate(splits):
                style = "k--" if split == "mixed" else f"C{i}-"
                ax.plot(rates, [med[x, split] for x in rates], style, marker="o", label=split)
            ax.set_yscale("log")
            ax.set_xlabel("arrival rate (req/s)")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        title = (
            f"{result['workload']} on {spec['engines']} engines of {result['profile']}: "
            "mixed against prefill/decode splits"
        )
        save_figure(fig, title, path)
        return
    jct = summary(result, "jct_p99_s", ("class", "load"))
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
    title = f"Prefill/decode splits against mixed, {spec['engines']} engines of {result['profile']}"
    save_figure(fig, title, path)
