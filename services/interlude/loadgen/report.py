"""Results of HTTP runs: the JSON, the SLO judgement, the side-by-side table and the plots.

A results file is `{"meta": {...}, "rows": [row, ...]}`; a row is one run (one arm at one
rate in one round: `arm`, `rate`, `run`, and `replay.summarize`'s metrics). `interlude loadgen
run` writes one arm's rows, `interlude bench http` every arm's; `compare` reads any number of
files and merges their rows by arm.

Sustainable rates use the rules of `interlude.slo` (the code `bench sim` and `bench engine`
use): per round, the SLO is 3x the reference arm's median normalized latency at its
lowest rate; an arm sustains a rate when every rate up to it meets the median rule (and the
tail rule: p99 within 10x the SLO, at most 1 % unfinished).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from interlude.sim.metrics import mean
from interlude.slo import judge_round, round_slo, sweep_ratios

# (row key, label, scale to the unit shown)
METRICS: tuple[tuple[str, str, float], ...] = (
    ("median_norm_latency_s", "median normalized latency (ms/token)", 1000.0),
    ("p90_norm_latency_s", "p90 normalized latency (ms/token)", 1000.0),
    ("p99_norm_latency_s", "p99 normalized latency (ms/token)", 1000.0),
    ("finished_per_s", "finished conversations/s", 1.0),
    ("ttft_mean_s", "TTFT mean (s)", 1.0),
    ("ttft_p99_s", "TTFT p99 (s)", 1.0),
    ("e2e_mean_s", "end to end mean (s)", 1.0),
    ("e2e_p99_s", "end to end p99 (s)", 1.0),
    ("tokens_per_s", "generated tokens/s", 1.0),
    ("resume_wait_mean_s", "resume wait mean (s): tool answer sent → next token", 1.0),
    ("resume_wait_p99_s", "resume wait p99 (s)", 1.0),
)


def load_rows(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every row of every results file; ValueError naming a file that is not one."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
            got = data["rows"]
            if not isinstance(got, list) or not all("arm" in r and "rate" in r for r in got):
                raise KeyError("rows")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a loadgen results file ({exc!r})") from None
        rows += got
    if not rows:
        raise ValueError("no runs in the given files")
    return rows


def by_arm(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    out: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        out.setdefault(str(r["arm"]), []).append(r)
    return out


def averaged(
    rows: Sequence[Mapping[str, Any]], key: str
) -> dict[float, tuple[float, float, float]]:
    """rate -> (mean, min, max) of `key` over the rounds at that rate (NaNs left out)."""
    per: dict[float, list[float]] = {}
    for r in rows:
        v = r.get(key)
        if isinstance(v, int | float) and not math.isnan(v):
            per.setdefault(float(r["rate"]), []).append(float(v))
    return {rate: (mean(vs), min(vs), max(vs)) for rate, vs in sorted(per.items())}


def judge(
    rows: Sequence[Mapping[str, Any]], reference: str, slo: float | None = None
) -> dict[str, Any]:
    """Per round: the SLO from `reference`'s runs (or `slo`, s/token, in every round: a sweep
    that continues an earlier one at its SLO) and every arm's sustainable rates; and
    `interlude`'s ratios over the other arms (median, mean and range over rounds)."""
    rounds = []
    for k in sorted({int(r.get("run", 0)) for r in rows}):
        mine = [r for r in rows if int(r.get("run", 0)) == k]
        ref = [r for r in mine if r["arm"] == reference]
        if slo is None and not ref:
            continue
        rounds.append(judge_round(mine, slo if slo is not None else round_slo(ref)) | {"run": k})
    if not rounds:
        raise ValueError(f"no runs of the reference arm {reference!r}")
    given = {"slo_given_s_per_token": slo} if slo is not None else {}
    return {"reference": reference, "rounds": rounds, "ratios": sweep_ratios(rounds)} | given


def _fmt(v: float, scale: float) -> str:
    x = v * scale
    return "-" if math.isnan(x) else f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"


def table_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """A Markdown table, one line per rate: each arm's median / p99 normalized latency
    (ms/token), finished/s and unfinished share (means over rounds)."""
    arms = by_arm(rows)
    head = ["rate"] + [f"{a}: p50 / p99 ms/tok, fin/s, unfin" for a in arms]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rates = sorted({float(r["rate"]) for r in rows})
    cols = {
        a: {k: averaged(rs, k) for k, _, _ in (*METRICS, ("unfinished_fraction", "", 1.0))}
        for a, rs in arms.items()
    }
    for rate in rates:
        cells = [f"{rate:g}"]
        for a in arms:
            c = cols[a]
            if rate not in c["finished_per_s"]:
                cells.append("not run")
                continue
            p50 = _fmt(c["median_norm_latency_s"].get(rate, (math.nan,))[0], 1000)
            p99 = _fmt(c["p99_norm_latency_s"].get(rate, (math.nan,))[0], 1000)
            fin = _fmt(c["finished_per_s"][rate][0], 1)
            unfin = c["unfinished_fraction"][rate][0]
            cells.append(f"{p50} / {p99}, {fin}, {unfin:.0%}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def verdict_lines(judged: Mapping[str, Any]) -> list[str]:
    """Sustainable rates per round (median rule / tail rule) and interlude's ratios; `{}`
    (no reference arm ran, so no SLO) says so in one line."""
    if not judged:
        return ["no verdict: the reference arm did not run, so there is no SLO to judge by"]
    arms = list(dict.fromkeys(a for r in judged["rounds"] for a in r["sustainable"]))
    lines = [
        "| round | SLO (ms/token) | " + " | ".join(arms) + " |",
        "|" + "---|" * (len(arms) + 2),
    ]
    for r in judged["rounds"]:
        cells = [str(r["run"] + 1), f"{r['slo_s_per_token'] * 1000:.1f}"]
        for a in arms:
            s = r["sustainable"].get(a, {})
            cells.append(f"{s.get('median')} / {s.get('tail')}")
        lines.append("| " + " | ".join(cells) + " |")
    for stock, entry in judged["ratios"].items():
        parts = []
        for rule in ("median", "tail"):
            e = entry.get(rule)
            if not e:
                parts.append(f"{rule} rule: no ratio")
                continue
            each = ", ".join(f"{v:.2f}" for v in e["rounds"])
            mid = statistics.median(e["rounds"])  # also for files from before it was stored
            parts.append(
                f"{rule} rule {mid:.2f}x median of rounds (mean {e['mean']:.2f}x; rounds {each})"
            )
        lines.append(f"interlude / {stock}: " + "; ".join(parts))
    if (given := judged.get("slo_given_s_per_token")) is not None:
        lines.append(
            f"SLO given ({given * 1000:.1f} ms/token), not set by this run: a rate is "
            "sustainable if this run's rates up to it met it, rates below the grid unjudged"
        )
    return lines


def plot(rows: Sequence[Mapping[str, Any]], path: Path, title: str = "") -> None:
    """Every metric against the rate, one line per arm (mean over rounds, band = range)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 4, figsize=(18, 11))
    for ax in axes.flat[len(METRICS) :]:
        ax.set_visible(False)
    for ax, (key, label, scale) in zip(axes.flat, METRICS, strict=False):
        for arm, rs in by_arm(rows).items():
            pts = averaged(rs, key)
            if not pts:
                continue
            xs = list(pts)
            ax.plot(xs, [pts[x][0] * scale for x in xs], marker="o", label=arm)
            ax.fill_between(
                xs, [pts[x][1] * scale for x in xs], [pts[x][2] * scale for x in xs], alpha=0.2
            )
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("arrival rate (conversations/s)")
        if "latency" in key or "p99" in key:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
