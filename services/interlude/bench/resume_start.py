"""How soon resumed turns start on the engines, read from their `/metrics` around a run.

Each engine counts, per resumed turn, the seconds from the tool's answer reaching its scheduler
to the turn's first step, by how the turn's KV came back (`interlude:resume_start_seconds{via}`,
a histogram). `meter(run_dir)` snapshots every engine of the `interlude up` stack in `run_dir`;
calling what it returns gives, per `via`, the turns that started meanwhile, their median (ms,
interpolated within its bucket as Prometheus' `histogram_quantile` does) and the share that
started within 5 ms: issue 28's target for turns whose KV stayed on the engine.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from interlude.stack.up import StackState

METRIC = "interlude:resume_start_seconds"
WITHIN_S = 0.005

Buckets = dict[tuple[str, float], float]  # (via, upper bound) -> cumulative count


def scrape(engines: Iterable[str], timeout_s: float = 5.0) -> Buckets:
    """The histogram's cumulative bucket counts, summed over `engines`."""
    out: Buckets = {}
    for url in engines:
        text = httpx.get(url + "/metrics", timeout=timeout_s).text
        for family in text_string_to_metric_families(text):
            if family.name != METRIC:
                continue
            for sample in family.samples:
                if sample.name == METRIC + "_bucket":
                    key = (sample.labels["via"], float(sample.labels["le"]))
                    out[key] = out.get(key, 0.0) + sample.value
    return out


def summary(before: Buckets, after: Buckets) -> dict[str, dict[str, float | None]]:
    """Per `via`: turns started between the snapshots, their median (ms) and the share that
    started within `WITHIN_S`."""
    per: dict[str, list[tuple[float, float]]] = {}
    for (via, le), n in after.items():
        per.setdefault(via, []).append((le, n - before.get((via, le), 0.0)))
    out: dict[str, dict[str, float | None]] = {}
    for via, cumulative in sorted(per.items()):
        cumulative.sort()
        turns = cumulative[-1][1]  # the +Inf bucket
        if turns <= 0:
            continue
        within = next((n for le, n in cumulative if le >= WITHIN_S), turns)
        out[via] = {
            "turns": turns,
            "p50_ms": _quantile(cumulative, 0.5),
            "within_5ms": within / turns,
        }
    return out


def _quantile(cumulative: list[tuple[float, float]], q: float) -> float | None:
    """The `q` quantile in ms, linear within its bucket (None if it lies in the +Inf bucket)."""
    rank = q * cumulative[-1][1]
    low_le, low_n = 0.0, 0.0
    for le, n in cumulative:
        if n >= rank:
            if le == float("inf"):
                return None
            share = (rank - low_n) / (n - low_n) if n > low_n else 0.0
            return 1000 * (low_le + (le - low_le) * share)
        low_le, low_n = le, n
    return None


def meter(run_dir: Path) -> Callable[[], dict[str, Any]]:
    """Start a meter over the engines of the stack in `run_dir` (none recorded: an empty
    summary)."""
    state = StackState.load(run_dir)
    engines = state.engines if state is not None else []
    before = scrape(engines)
    return lambda: summary(before, scrape(engines))


def by_arm(rows: Iterable[dict[str, Any]]) -> dict[str, dict[float, dict[str, dict[str, Any]]]]:
    """Per arm, rate and `via`: the median over rounds of each round's median start (ms) and
    share within 5 ms, and the turns counted (rows with `resume_start` only)."""
    per: dict[str, dict[float, dict[str, list[dict[str, Any]]]]] = {}
    for r in rows:
        for via, s in (r.get("resume_start") or {}).items():
            per.setdefault(r["arm"], {}).setdefault(r["rate"], {}).setdefault(via, []).append(s)
    return {
        arm: {
            rate: {via: _median_of(ss) for via, ss in sorted(vias.items())}
            for rate, vias in sorted(rates.items())
        }
        for arm, rates in per.items()
    }


def _median_of(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    def med(key: str) -> float | None:
        xs = [s[key] for s in summaries if s.get(key) is not None]
        return round(statistics.median(xs), 3) if xs else None

    return {
        "p50_ms": med("p50_ms"),
        "within_5ms": med("within_5ms"),
        "turns": sum(s["turns"] for s in summaries),
    }


def lines(summary: dict[str, dict[float, dict[str, dict[str, Any]]]]) -> list[str]:
    """`by_arm`'s summary as text, a line per arm and way the KV came back."""
    out = []
    for arm, rates in summary.items():
        for via in sorted({v for vias in rates.values() for v in vias}):
            cells = []
            for rate, vias in rates.items():
                s = vias.get(via)
                if s is None:
                    continue
                p50 = "-" if s["p50_ms"] is None else f"{s['p50_ms']:.1f} ms"
                within = "" if s["within_5ms"] is None else f", {s['within_5ms']:.0%} <= 5 ms"
                cells.append(f"{rate:g}/s: {p50}{within}")
            out.append(f"  {arm:18s} {via:12s} " + "  ".join(cells))
    return out
