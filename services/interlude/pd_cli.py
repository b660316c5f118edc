"""`interlude bench pd`: prefill and decode engines against mixed ones at equal hardware on
TetriInfer's four workload classes (bench/cluster_pd.py, a reduced cluster model)."""

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
    loads: Annotated[
        str, typer.Option(help="offered loads, shares of capacity")
    ] = "0.3,0.5,0.7,0.9",
    rounds: Annotated[int, typer.Option(min=1, help="rounds (seeds 0..rounds-1)")] = 3,
    engines: Annotated[int, typer.Option(min=2)] = 4,
    duration: Annotated[float, typer.Option(help="seconds of arrivals")] = 120.0,
    link_gbps: Annotated[float, typer.Option(help="KV link, GB/s")] = 40.0,
    plot: Annotated[Path | None, typer.Option(help="default: the JSON path, .png")] = None,
) -> None:
    """All-mixed engines against every prefill:decode split of the same engines."""
    from interlude.bench.cluster_pd import PDSpec, run_pd
    from interlude.bench.cluster_pd_report import markdown_rows, plot_pd
    from interlude.bench.report import publish
    from interlude.policy import load_profile

    spec = PDSpec(engines=engines, duration_s=duration, link_bytes_per_s=link_gbps * 1e9)
    result = run_pd(
        spec,
        load_profile(profile),
        tuple(float(x) for x in loads.split(",")),
        tuple(range(rounds)),
        progress=lambda line: say(console, line),
    )
    publish(
        result,
        json_out,
        plot,
        plot_pd,
        markdown_rows(result),
        lambda line: console.print(line, highlight=False, soft_wrap=True),
    )
