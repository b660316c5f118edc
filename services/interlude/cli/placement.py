"""`interlude bench placement`: TetriInfer's decode placement rules on a synthetic spread
(bench/placement.py), every rule on the same arrivals, rounds of new arrivals."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from interlude.ui import make_console, say

console = make_console()


def bench_placement(
    json_out: Annotated[Path, typer.Option("--json", help="write the results here")],
    profile: Annotated[str, typer.Option(help="the device: a shipped profile or a JSON path")] = (
        "llama3-8b-h100"
    ),
    rates: Annotated[str, typer.Option(help="requests/s, a comma list")] = "6,8,10,12",
    rounds: Annotated[int, typer.Option(min=1, help="rounds (seeds 0..rounds-1)")] = 3,
    engines: Annotated[int, typer.Option(min=2)] = 4,
    duration: Annotated[float, typer.Option(help="seconds of arrivals")] = 120.0,
    heavy_share: Annotated[float, typer.Option(help="share of requests with a heavy decode")] = (
        0.5
    ),
    accuracy: Annotated[float, typer.Option(help="the predictor's heavy/light accuracy")] = 0.85,
    kv_tokens: Annotated[int, typer.Option(help="each engine's KV room in tokens")] = 24_000,
    plot: Annotated[Path | None, typer.Option(help="default: the JSON path, .png")] = None,
) -> None:
    """Decode placement by heavy:light share, predicted work, request count and at random
    (and the worst case), on decode engines of one profile: latencies by rate."""
    from interlude.bench.placement import PlacementSpec, run_placement
    from interlude.bench.placement_report import markdown_rows, plot_placement
    from interlude.bench.report import publish
    from interlude.policy import load_profile

    spec = PlacementSpec(
        engines=engines,
        duration_s=duration,
        heavy_share=heavy_share,
        accuracy=accuracy,
        kv_tokens=kv_tokens,
    )
    result = run_placement(
        spec,
        load_profile(profile),
        tuple(float(r) for r in rates.split(",")),
        tuple(range(rounds)),
        progress=lambda line: say(console, line),
    )
    publish(
        result,
        json_out,
        plot,
        plot_placement,
        markdown_rows(result),
        lambda line: console.print(line, highlight=False, soft_wrap=True),
    )
