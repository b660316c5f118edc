"""`interlude bench pd`: prefill and decode engines against mixed ones at equal hardware, in
the simulator's cluster (bench/cluster_pd.py): on TetriInfer's four workload classes, or on an
agent workload at given rates."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from interlude.ui import make_console, say

console = make_console()


def bench_pd(
    json_out: Annotated[Path, typer.Option("--json", help="write the results here")],
    profile: Annotated[str, typer.Option(help="the device: a shipped profile or a JSON path")] = (
        "llama3-8b-h100"
    ),
    workload: Annotated[
        str,
        typer.Option(
            help="'classes' (TetriInfer's four), or agents: shared, generated:NAME, a path"
        ),
    ] = "classes",
    loads: Annotated[
        str, typer.Option(help="classes: offered loads, shares of capacity")
    ] = "0.3,0.5,0.7,0.9",
    rates: Annotated[
        str, typer.Option(help="agent workloads: arrival rates, req/s")
    ] = "8,12,16,20",
    rounds: Annotated[int, typer.Option(min=1, help="rounds (seeds 0..rounds-1)")] = 3,
    engines: Annotated[int, typer.Option(min=2)] = 4,
    duration: Annotated[float, typer.Option(help="seconds of arrivals")] = 120.0,
    link_gbps: Annotated[float, typer.Option(help="KV link, GB/s")] = 40.0,
    policy: Annotated[str, typer.Option(help="the engines' policy")] = "interlude",
    flip_window: Annotated[
        float, typer.Option(help="> 0: idle engines flip role after this many seconds")
    ] = 0.0,
    plot: Annotated[Path | None, typer.Option(help="default: the JSON path, .png")] = None,
) -> None:
    """All-mixed engines against every prefill:decode split of the same engines."""
    from interlude.bench.cluster_pd import PDSpec, run_agents, run_pd
    from interlude.bench.cluster_pd_report import markdown_rows, plot_pd
    from interlude.bench.report import publish
    from interlude.bench.sweep import parse_rates, resolve_pool, resolve_spec

    spec = PDSpec(engines, duration, link_gbps * 1e9, policy, flip_window)
    seeds = tuple(range(rounds))

    def progress(line: str) -> None:
        say(console, line)

    if workload == "classes":
        numbers = tuple(float(x) for x in loads.split(","))
        result = run_pd(spec, profile, numbers, seeds, progress=progress)
    else:
        pool = resolve_pool(workload, 0)
        result = run_agents(spec, profile, pool, parse_rates(rates), seeds, progress=progress)
        result["workload"] = resolve_spec(workload)
    publish(
        result,
        json_out,
        plot,
        plot_pd,
        markdown_rows(result),
        lambda line: console.print(line, highlight=False, soft_wrap=True),
    )
