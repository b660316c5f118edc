"""`interlude bench toolbus`: the tool bus's round trip and throughput (`bench/toolbus.py`)."""

from __future__ import annotations

import json
import platform
import signal
from pathlib import Path
from typing import Annotated

import typer

from interlude.ui import cores, exit_on_term, make_console, say

console = make_console()


def _rates(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(r) for r in text.split(",") if r)
    except ValueError:
        raise typer.BadParameter("rates are a comma list of numbers, e.g. 250,500,1000") from None


def _say(line: str) -> None:
    say(console, line)


def bench_toolbus(
    json_out: Annotated[Path, typer.Option("--json", help="write the results here")],
    rates: Annotated[str, typer.Option(help="calls/s, one latency phase each")] = "250,500,1000",
    headline: Annotated[float, typer.Option(help="the rate of the top-level p50/p99")] = 1000.0,
    duration: Annotated[float, typer.Option(help="seconds of arrivals per rate")] = 10.0,
    workers: Annotated[int, typer.Option(min=1, help="worker processes")] = 4,
    saturate: Annotated[float, typer.Option(help="seconds of the throughput phase")] = 5.0,
    plot_out: Annotated[Path | None, typer.Option("--plot", help="default: next to --json")] = None,
    run_dir: Annotated[Path, typer.Option(help="server data and logs")] = Path(
        ".interlude-bench/toolbus"
    ),
) -> None:
    """Engine → calculator → engine over the tool bus on loopback: p50/p99 per rate, the
    maximum calls/s with WORKERS worker processes, and the floor of two bare stream hops."""
    from interlude.bench.toolbus import ToolbusSpec, run_toolbus_bench
    from interlude.bench.toolbus_report import lines, plot

    try:
        spec = ToolbusSpec(
            rates=_rates(rates),
            headline_rate=headline,
            duration_s=duration,
            workers=workers,
            saturate_s=saturate,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    signal.signal(signal.SIGTERM, exit_on_term)
    result = run_toolbus_bench(spec, run_dir.resolve(), _say)
    result["machine"] = f"{platform.machine()}, {cores()} cores"
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(result, indent=1))
    out_png = plot_out or json_out.with_suffix(".png")
    plot(result, out_png)
    for line in lines(result):
        _say(line)
    _say(f"wrote {json_out} and {out_png}")


def bench_toolbus_faults(
    calls: Annotated[int, typer.Option(min=1, help="calls to send")] = 3000,
    rate: Annotated[float, typer.Option(help="calls/s")] = 300.0,
    workers: Annotated[int, typer.Option(min=1, help="worker processes")] = 3,
    kills: Annotated[int, typer.Option(min=0, help="random SIGKILLs of workers")] = 6,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the counts here")] = None,
    run_dir: Annotated[Path, typer.Option(help="server data and logs")] = Path(
        ".interlude-bench/toolbus-faults"
    ),
) -> None:
    """Thousands of calls while workers are SIGKILLed, the server restarts once (AOF on) and a
    poison call kills its workers: prints the counts; exit status 1 unless every call got
    exactly one right result and the poison call was dead-lettered."""
    import logging

    from interlude.bench.toolbus_faults import DrillSpec, as_json, report_lines, run_drill

    try:
        spec = DrillSpec(calls=calls, rate=rate, workers=workers, kills=kills)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    # Reconnect warnings are the point of the drill, not news: the counts say what happened.
    logging.basicConfig(level=logging.ERROR)
    signal.signal(signal.SIGTERM, exit_on_term)
    report = run_drill(spec, run_dir.resolve(), _say)
    for line in report_lines(report):
        _say(line)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(as_json(report), indent=1))
    problems = report.problems()
    _say("exactly one right result per call: " + ("yes" if not problems else "; ".join(problems)))
    if problems:
        raise typer.Exit(1)
