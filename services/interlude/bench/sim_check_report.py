"""`interlude bench sim-check` results: the table, the verdict lines and the plot. Pure
functions over the JSON `run_sim_check` writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from interlude.bench.report import save_figure
from interlude.bench.sim_check import points
from interlude.bench.sweep import REFERENCE_POLICY


def _pct(engine: float, sim: float) -> str:
    return f"{(engine / sim - 1) * 100:+.0f} %" if sim > 0 else "-"


def markdown_rows(result: dict[str, Any]) -> list[str]:
    """One row per (policy, rate) the engine ran: both sides' median, p99, finished/s and
    unfinished share, and what each recomputed, found in its prefix cache and swapped
    (device clock, ms per token)."""
    lines = [
        "| policy | rate | median ms/token: sim / engine | p99 | finished/s | unfinished "
        "| recomputed tokens | found in the prefix cache | swapped tokens |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    rows = result["rows"]
    for policy in result["spec"]["policies"]:
        sim = {p["rate"]: p for p in points(rows, "sim", policy)}
        for e in points(rows, "engine", policy):
            s = sim[e["rate"]]
            med_s, med_e = s["normalized_latency_median"], e["normalized_latency_median"]
            p99_s, p99_e = s["normalized_latency_p99"], e["normalized_latency_p99"]
            lines.append(
                f"| {policy} | {e['rate']:g} "
                f"| {med_s * 1e3:.1f} / {med_e * 1e3:.1f} ({_pct(med_e, med_s)}) "
                f"| {p99_s * 1e3:.0f} / {p99_e * 1e3:.0f} "
                f"| {s['throughput_rps']:.2f} / {e['throughput_rps']:.2f} "
                f"| {s['unfinished_fraction']:.0%} / {e['unfinished_fraction']:.0%} "
                f"| {s['recomputed_tokens']:,} / {e['recomputed_tokens']:,} "
                f"| {s.get('prefix_hit_tokens', 0):,} / {e.get('prefix_hit_tokens', 0):,} "
                f"| {s['swapped_tokens']:,} / {e['swapped_tokens']:,} |"
            )
    return lines


def verdict_lines(result: dict[str, Any]) -> list[str]:
    v = result["verdict"]
    out = [
        f"SLO {v['slo'] * 1e3:.1f} ms/token (3x the simulator's {REFERENCE_POLICY} median at "
        f"{result['spec']['slo_rate']:g}/s); rate step {v['rate_step']:g}/s"
    ]
    if "engine_slo" in v:
        out.append(
            f"the engine's own SLO {v['engine_slo'] * 1e3:.1f} ms/token (3x its {REFERENCE_POLICY}"
            f" median at {result['spec']['slo_rate']:g}/s)"
        )
    for policy, e in v["policies"].items():
        line = f"{policy}: sustainable (median / tail rule) sim {e['sim_rate_median']} / "
        line += f"{e['sim_rate_tail']}"
        if "engine_rate_median" in e:
            below = e["median_gap_below_saturation"].items()
            gaps = ", ".join(f"{float(r):g}/s {g * 100:+.0f} %" for r, g in below)
            rates = "agree" if e["rates_agree"] else "DISAGREE"
            latency = "within 15 %" if e["latency_agrees"] else "NOT within 15 %"
            line += (
                f", engine {e['engine_rate_median']} / {e['engine_rate_tail']}: rates {rates}; "
                f"medians below saturation {latency} ({gaps or 'no rate below it'})"
            )
        if "engine_own_slo_rates" in e:
            own_median, own_tail = e["engine_own_slo_rates"]
            line += f"; by the engine's own SLO {own_median} / {own_tail}"
        out.append(line)
    return out


def plot_sim_check(result: dict[str, Any], path: Path) -> None:
    """Per policy: median and p99 normalized latency against rate, the simulator's as lines,
    the engine's as dots, the SLO dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = result["spec"]["policies"]
    fig, axes = plt.subplots(1, len(policies), figsize=(4.6 * len(policies), 4.2), squeeze=False)
    rows = result["rows"]
    for ax, policy in zip(axes[0], policies, strict=True):
        for key, label, color in (
            ("normalized_latency_median", "median", "C0"),
            ("normalized_latency_p99", "p99", "C3"),
        ):
            sim, real = points(rows, "sim", policy), points(rows, "engine", policy)
            ax.plot(
                [p["rate"] for p in sim],
                [p[key] * 1e3 for p in sim],
                color=color,
                label=f"simulator {label}",
            )
            ax.plot(
                [p["rate"] for p in real],
                [p[key] * 1e3 for p in real],
                "o",
                color=color,
                label=f"engine {label}",
            )
        ax.axhline(result["verdict"]["slo"] * 1e3, color="k", ls="--", lw=1, label="SLO")
        ax.set_yscale("log")
        ax.set_title(policy)
        ax.set_xlabel("arrival rate (conversations/s)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("normalized latency (ms/token, device clock)")
    axes[0][0].legend(fontsize=8)
    spec = result["spec"]
    title = (
        f"simulator vs emulated engine: {spec['profile']}, {spec['workload']} trace, tool times "
        f"/{spec['time_scale']:g}, {spec['duration_s']:g} s of arrivals, "
        f"dilation {spec['dilation']:g}"
    )
    save_figure(fig, title, path)
