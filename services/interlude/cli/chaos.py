"""`interlude bench chaos`: conversations through the gateway while the stack's parts die
(`bench/chaos.py`)."""

from __future__ import annotations

import json
import logging
import signal
from pathlib import Path
from typing import Annotated

import typer

from interlude.ui import exit_on_term, make_console, say

console = make_console()


def _say(line: str) -> None:
    say(console, line)


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
    for line in lines(result):
        _say(line)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result, indent=1))
        _say(f"wrote {json_out}")
    if result["failures"]:
        raise typer.Exit(1)
