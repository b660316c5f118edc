"""What `bench pool` saw: its summary lines, and a plot of the engines over time beside the
numbers the rule read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def changes(passes: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The passes whose engine counts differ from the pass before (the first included)."""
    out: list[Mapping[str, Any]] = []
    last: tuple[int, int] | None = None
    for p in passes:
        now = (int(p["serving"]), int(p["draining"]))
        if now != last:
            out.append(p)
            last = now
    return out


def summary(result: Mapping[str, Any]) -> dict[str, Any]:
    passes = result["passes"]
    most = max((int(p["serving"]) for p in passes), default=0)
    first_up = next((p["t"] for p in passes if p["direction"] == "up"), None)
    at_most = next((p["t"] for p in passes if p["serving"] == most and p["ready"] == most), None)
    end = result["load_end_s"]
    floor = int(result["spec"]["min_engines"])
    back = next(
        (p["t"] for p in passes if p["t"] > end and p["serving"] == floor and not p["draining"]),
        None,
    )
    return {
        "most_engines": most,
        "first_up_s": first_up,
        "all_ready_at_most_s": at_most,
        "back_to_min_s": back,
        "passes": len(passes),
    }


def lines(result: Mapping[str, Any]) -> list[str]:
    s = summary(result)
    c = result["conversations"]
    arrivals_end = max(p["end_s"] for p in result["phases"])
    out = [
        f"arrivals {result['load_start_s']:.0f}-{arrivals_end:.0f} s ("
        + ", ".join(f"{p['rate']:g}/s from {p['start_s']:.0f} s" for p in result["phases"])
        + f"); the last conversation ended or was given up at {result['load_end_s']:.0f} s",
        f"conversations: {c['finished']} of {c['arrived']} arrived finished, "
        f"{c.get('still_running', 0)} still running at the end, "
        f"{sum(c.get('errors', {}).values())} failed ({c['planned']} planned)",
        *(f"  {n} x {error}" for error, n in c.get("errors", {}).items()),
        f"engines: at most {s['most_engines']}; first scale-up decided at "
        f"{_t(s['first_up_s'])}, all {s['most_engines']} ready at {_t(s['all_ready_at_most_s'])}, "
        f"back to {result['spec']['min_engines']} at {_t(s['back_to_min_s'])}"
        + ("" if result["settled"] else " (not settled when the wait ended)"),
    ]
    for p in changes(result["passes"]):
        out.append(
            f"  {p['t']:7.1f} s: {p['serving']} serving ({p['ready']} ready), "
            f"{p['draining']} draining; {p['direction']}: {p['reason']}"
        )
    if result["gave_up"]:
        out.append(f"the supervisor gave up: {result['gave_up']}")
    return out


def _t(v: float | None) -> str:
    return "never" if v is None else f"{v:.0f} s"


def plot(result: Mapping[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    passes = result["passes"]
    t = [p["t"] for p in passes]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for p in result["phases"]:
        for ax in (top, bottom):
            ax.axvspan(p["start_s"], p["end_s"], alpha=0.08 + 0.04 * min(p["rate"], 4), lw=0)
        top.text(p["start_s"], 0.2, f"{p['rate']:g}/s", fontsize=8)
    top.step(t, [p["serving"] for p in passes], where="post", label="serving")
    top.step(t, [p["ready"] for p in passes], where="post", label="ready", ls="--")
    top.step(t, [p["draining"] for p in passes], where="post", label="draining")
    top.step(t, [p["desired"] for p in passes], where="post", label="desired", ls=":")
    top.set_ylabel("engines")
    top.legend(loc="upper right", fontsize=8)
    targets = result.get("targets", {})
    for key, label in (("queue_depth", "waiting per engine"), ("kv_usage", "KV usage")):
        values = [p["observed"].get(key) for p in passes]
        bottom.plot(t, [v if v is not None else float("nan") for v in values], label=label)
        if key in targets:
            bottom.axhline(targets[key], ls=":", lw=0.8, color="grey")
    bottom.set_yscale("symlog", linthresh=1.0)
    bottom.set_ylim(bottom=0)
    bottom.set_xlabel("seconds since the pool started")
    bottom.legend(loc="upper right", fontsize=8)
    top.set_title(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
