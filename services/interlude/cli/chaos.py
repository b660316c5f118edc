"""`interlude bench chaos`: conversations through the gateway while the stack's parts die
(`bench/chaos.py`); `interlude bench pool`: a pool scaled by the operator's rule under load
(`bench/pool_demo.py`)."""

from __future__ import annotations

import json
import logging
import signal
from pathlib import Path
from typing import Annotated, Any

import typer

from interlude.ui import exit_on_term, make_console, say

console = make_console()


def _say(line: str) -> None:
    say(console, line)


def _report(shown: list[str], result: dict[str, Any], json_out: Path | None) -> None:
    """Print a run's lines; write its result as JSON when asked."""
    for line in shown:
        _say(line)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result, indent=1))
        _say(f"wrote {json_out}")


def bench_chaos(
    conversations: Annotated[
        int, typer.Option(min=2, help="conversations expected (Poisson arrivals: about this many)")
    ] = 60,
    duration: Annotated[float, typer.Option(help="seconds of arrivals (and of faults)")] = 60.0,
    engines: Annotated[int, typer.Option(min=1, help="engine processes")] = 2,
    faults: Annotated[
        str,
        typer.Option(
            help="comma list, in order: valkey-pause, engine, valkey-kill, tools, valkey-term"
        ),
    ] = "valkey-pause,engine,valkey-kill,tools,valkey-term",
    pause: Annotated[float, typer.Option(help="seconds Valkey is SIGSTOPped (valkey-pause)")] = (
        20.0
    ),
    horizon: Annotated[float, typer.Option(help="seconds until a running one is lost")] = 240.0,
    seed: Annotated[int, typer.Option()] = 0,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the result here")] = None,
    run_dir: Annotated[Path, typer.Option(help="the stack's logs and data")] = Path(
        ".interlude-bench/chaos"
    ),
) -> None:
    """A stack under load (client- and server-side tools) while Valkey hangs (SIGSTOP) then
    is restarted twice, an engine and the tools worker are SIGKILLed: each conversation
    finished, or ended with an error the client can retry; engines ready while Valkey hung;
    no call acted twice; no KV or session left. Exit status 1 otherwise."""
    from interlude.bench.chaos import ChaosSpec, run_chaos
    from interlude.bench.chaos_report import lines
    from interlude.cli.loadgen import texts_for

    try:
        spec = ChaosSpec(
            conversations=conversations,
            duration_s=duration,
            engines=engines,
            faults=tuple(f for f in faults.split(",") if f),
            horizon_s=horizon,
            pause_s=pause,
            seed=seed,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    # Reconnect warnings are the point of the drill, not news: the result says what happened.
    logging.basicConfig(level=logging.ERROR)
    signal.signal(signal.SIGTERM, exit_on_term)
    result = run_chaos(spec, run_dir.resolve(), texts_for("tiny"), _say)
    _report(lines(result), result, json_out)
    if result["failures"]:
        raise typer.Exit(1)


def bench_pool(
    engines: Annotated[int, typer.Option(min=1, help="the most engines the pool may run")] = 4,
    min_engines: Annotated[int, typer.Option(min=1, help="engines at start and at rest")] = 1,
    phases: Annotated[
        str, typer.Option(help="the load: SECONDS@RATE, comma-separated (conversations/s)")
    ] = "60@0.5,180@4",
    settle: Annotated[
        float, typer.Option(help="seconds to wait after the load for the pool to shrink")
    ] = 300.0,
    up_window: Annotated[float, typer.Option(help="the scale-up window, seconds")] = 15.0,
    down_window: Annotated[float, typer.Option(help="the scale-down window, seconds")] = 60.0,
    targets: Annotated[
        str, typer.Option(help="e.g. 'kvUsage=0.5,queueDepth=4' (default: the operator's)")
    ] = "",
    emulate: Annotated[
        str, typer.Option(help="the engines' emulated accelerator (a profile; 'none': the CPU)")
    ] = "llama3-8b-h100",
    blocks: Annotated[int | None, typer.Option(help="each engine's KV blocks")] = None,
    workload: Annotated[str, typer.Option(help="shared, generated:NAME or a .jsonl")] = "shared",
    seed: Annotated[int, typer.Option()] = 0,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the result here")] = None,
    plot_out: Annotated[Path | None, typer.Option("--plot", help="write the plot here")] = None,
    run_dir: Annotated[Path, typer.Option(help="the stack's logs and data")] = Path(
        ".interlude-bench/pool"
    ),
) -> None:
    """A pool scaled by the operator's rule under a rising load and back: engines started,
    drained and stopped as `interlude up --min-engines` does, every decision recorded."""
    from interlude.bench.pool_demo import PoolDemoSpec, run_pool_demo
    from interlude.bench.pool_report import lines, plot
    from interlude.cli.loadgen import texts_for
    from interlude.loadgen.plan import TINY, Scale

    try:
        steps = tuple(
            (float(d), float(r)) for d, r in (p.split("@") for p in phases.split(",") if p)
        )
        emulated = None if emulate == "none" else emulate
        spec = PoolDemoSpec(
            min_engines=min_engines,
            max_engines=engines,
            phases=steps,
            settle_s=settle,
            up_window_s=up_window,
            down_window_s=down_window,
            targets=targets,
            emulate=emulated,
            blocks=blocks,
            workload=workload,
            seed=seed,
            scale=Scale() if emulated else TINY,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    logging.basicConfig(level=logging.ERROR)
    signal.signal(signal.SIGTERM, exit_on_term)
    result = run_pool_demo(spec, run_dir.resolve(), texts_for("tiny"), _say)
    _report(lines(result), result, json_out)
    if plot_out is not None:
        where = f"{emulate} emulated" if emulated else "the CPU"
        plot(result, plot_out, f"engines scaled by the operator's rule ({where}, {workload})")
        _say(f"wrote {plot_out}")
