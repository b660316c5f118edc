"""Tables and plots of a sweep result (the JSON that `run_sweep` returns)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.table import Table


def _at(result: dict[str, Any], policy: str, rate: float) -> dict[str, Any]:
    """The point nearest `rate`; it may be a skipped one (`skipped` true, no metrics)."""
    points = result["policies"][policy]["points"]
    return min(points, key=lambda p: abs(p["rate"] - rate))


def sustainable_rates(entry: dict[str, Any]) -> tuple[float | None, float | None]:
    """(median-only, tail-aware) sustainable rates of one policy's entry.

    A sweep saved before the tail rule existed has only `sustainable_rate` (the median one);
    its tail rate is unknown (None).
    """
    if "sustainable_rate_median" in entry:
        return entry["sustainable_rate_median"], entry["sustainable_rate_tail"]
    return entry["sustainable_rate"], None


def report_rate(result: dict[str, Any]) -> float:
    """Default rate for the detail table: infercept's median sustainable rate, else the highest."""
    entry = result["policies"].get("infercept")
    r = sustainable_rates(entry)[0] if entry is not None else None
    return float(r) if r is not None else max(result["rates"])


def _rate_cells(s: float | None, base: float | None) -> tuple[str, str]:
    """The rate and its ratio to vllm's."""
    return (f"{s:g}" if s is not None else "none", f"{s / base:.2f}" if s and base else "-")


def _bound_note(result: dict[str, Any]) -> str:
    """The rate no policy can sustain (absent in sweeps saved before it was worked out)."""
    bound = result.get("rate_bound")
    return f"; no policy can sustain {bound:.2f} req/s or more (bench/bound.py)" if bound else ""


def _waste_cell(pt: dict[str, Any]) -> str:
    """Contended waste (held while requests queued for memory: what goals and scaling read),
    then all paused-held KV; sweeps saved before the split have only the second."""
    every = f"{pt['waste_fraction'] * 100:.1f} %"
    contended = pt.get("waste_contended_fraction")
    return f"{contended * 100:.1f} / {every}" if contended is not None else f"- / {every}"


def summary_table(result: dict[str, Any], rate: float) -> Table:
    slo = result["slo_normalized_latency"]
    tail = result.get("tail_slo_normalized_latency")
    rule = (
        f"; tail: p99 <= {tail * 1000:.0f} ms/token, <= "
        f"{result['max_unfinished_fraction'] * 100:g} % unfinished"
        if tail is not None
        else ""
    )
    t = Table(
        title=(
            f"{result['profile']} on {result['workload']}, {result['duration_s']:.0f} s per "
            f"rate; SLO = {slo * 1000:.1f} ms/token median normalized latency{rule}; details at "
            f"{rate:g} req/s{_bound_note(result)}"
        )
    )
    for col in (
        "policy",
        "sustainable req/s median",
        "x vllm",
        "sustainable req/s tail",
        "x vllm (tail)",
        "norm. lat. p50 / p99 (ms/tok)",
        "unfinished",
        "throughput req/s",
        "TTFT mean / p99 (s)",
        "e2e mean / p99 (s)",
        "KV waste contended / all",
        "recompute share",
    ):
        t.add_column(col, justify="right")
    vllm = result["policies"].get("vllm")
    base_median, base_tail = sustainable_rates(vllm) if vllm is not None else (None, None)
    for name, entry in result["policies"].items():
        median, tail_rate = sustainable_rates(entry)
        # A sweep saved before the tail rule: its tail rate is unknown, not "none".
        tail_cells = _rate_cells(tail_rate, base_tail) if tail is not None else ("-", "-")
        pt = _at(result, name, rate)
        if pt.get("skipped"):
            # Not simulated: the policy had failed twice in a row below this rate.
            details = ["skipped"] * 7
        else:
            unfinished = pt.get("unfinished_fraction")
            details = [
                f"{pt['normalized_latency_median'] * 1000:.1f} / "
                f"{pt['normalized_latency_p99'] * 1000:.1f}",
                f"{unfinished * 100:.1f} %" if unfinished is not None else "-",
                f"{pt['throughput_rps']:.2f}",
                f"{pt['ttft_mean']:.2f} / {pt['ttft_p99']:.2f}",
                f"{pt['e2e_mean']:.1f} / {pt['e2e_p99']:.1f}",
                _waste_cell(pt),
                f"{pt['recompute_fraction'] * 100:.1f} %",
            ]
        t.add_row(name, *_rate_cells(median, base_median), *tail_cells, *details)
    best = peers_at_best(result)
    if best:
        t.caption = "each peer at its best configuration here (tail rule): " + "; ".join(
            f"{family}: {name} ({rate_text})" for family, (name, rate_text) in best.items()
        )
    return t


def family_of(name: str) -> str:
    """The peer a swept policy is a configuration of (itself if none, or not importable)."""
    from interlude.policy import policy_class

    try:
        return policy_class(name).family or name
    except ValueError:
        return name


def peers_at_best(result: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Peers swept in more than one configuration -> (the best one by the tail-rule rate,
    then the median rule's, its rate). A configuration that sustains no rate loses."""
    families: dict[str, list[str]] = {}
    for name in result["policies"]:
        families.setdefault(family_of(name), []).append(name)
    out: dict[str, tuple[str, str]] = {}
    for family, names in families.items():
        if len(names) < 2:
            continue

        def score(n: str) -> tuple[float, float]:
            median, tail = sustainable_rates(result["policies"][n])
            return (tail or 0.0, median or 0.0)

        best = max(names, key=score)
        tail, median = score(best)
        out[family] = (best, f"{tail:g} req/s, median rule {median:g}")
    return out


def markdown_table(result: dict[str, Any], rate: float) -> str:
    """The same table as Markdown, for the README."""
    table = summary_table(result, rate)
    headers = [str(c.header) for c in table.columns]
    rows = [list(map(str, c.cells)) for c in table.columns]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for i in range(len(rows[0])):
        lines.append("| " + " | ".join(col[i] for col in rows) + " |")
    if table.caption:
        lines += ["", str(table.caption)]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    """Normalized latency, throughput and TTFT against rate for every policy (paper Fig. 2)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(21, 4.8))
    panels = (
        ("normalized_latency_median", "median normalized latency (s/token)", True),
        ("normalized_latency_p99", "p99 normalized latency (s/token)", True),
        ("throughput_rps", "throughput (finished req/s)", False),
        ("ttft_mean", "mean TTFT (s)", True),
    )
    for ax, (key, label, log) in zip(axes, panels, strict=True):
        for name, entry in result["policies"].items():
            # Skipped rates were not simulated: the line ends where the policy stopped.
            pts = [p for p in entry["points"] if not p.get("skipped")]
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
    bound = result.get("rate_bound")
    if bound:
        for ax in axes:
            ax.axvline(bound, color="grey", ls="-.", lw=1)
        axes[0].plot([], [], color="grey", ls="-.", lw=1, label="no policy beyond")
    tail = result.get("tail_slo_normalized_latency")
    if tail is not None:  # absent in sweeps saved before the tail rule
        axes[1].axhline(tail, color="k", ls=":", lw=1, label="tail bound")
        axes[1].legend(fontsize=8)
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


def publish(
    result: dict[str, Any],
    json_out: Path,
    plot_out: Path | None,
    plot_fn: Callable[[dict[str, Any], Path], None],
    rows: Sequence[str],
    show: Callable[[str], None],
) -> None:
    """A benchmark's last step: its JSON, its plot (beside the JSON unless named), its table."""
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(result, indent=1))
    plot_fn(result, plot_out or json_out.with_suffix(".png"))
    for line in rows:
        show(line)
