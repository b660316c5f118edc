"""The simulator's commands: `bench compile`, `bench sim`, `bench report`, `bench bound`.

They run on the base install (the simulator, the policies and their benches need no extra).
`root.py` registers them under `interlude bench`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from interlude.policy import POLICIES, load_profile
from interlude.ui import make_console

if TYPE_CHECKING:
    from interlude.bench.sweep import SweepSpec

# Tables are wide; when output is not a terminal (CI logs, pipes) do not wrap them at 80.
console = make_console()
Workload = Annotated[
    str, typer.Option(help="trace JSON path, 'shared', 'generated:NAME' or 'auto'")
]
ProfileName = Annotated[str, typer.Option(help="profile name or JSON path")]


def _use_compiled() -> bool:
    """`INTERLUDE_SIM_COMPILED`: auto runs on a matching build if there is one, on makes one."""
    from interlude import compiled

    wanted = compiled.mode()
    if wanted == "off":
        return False
    if wanted == "auto":
        return compiled.build_dir() is not None
    _compile()
    return True


def _compile() -> Path:
    from interlude import compiled
    from interlude.bench import compiled_build

    if (found := compiled.build_dir()) is not None:
        return found
    with console.status("compiling the simulator and policies with mypyc (about a minute)"):
        try:
            return compiled_build.build()
        except (compiled_build.BuildError, ImportError) as exc:
            console.print(f"[red]cannot compile the simulator:[/] {exc}")
            raise typer.Exit(1) from None


def bench_compile() -> None:
    """Compile the simulator and policies with mypyc (once per source change): `bench sim`
    then runs its points on the build, with the same results, about 1.6x faster."""
    t0 = time.perf_counter()
    found = _compile()
    console.print(f"compiled build: {found} ({time.perf_counter() - t0:.0f} s)")


def bench_sim(
    workload: Workload = "auto",
    profile: ProfileName = "gptj-6b-a100-40g",
    policies: Annotated[str, typer.Option(help="comma list or 'all'")] = "all",
    rates: Annotated[str, typer.Option(help="START:STOP:STEP or a comma list")] = "0.5:4:0.25",
    duration: Annotated[float, typer.Option(help="simulated seconds of arrivals per rate")] = 1800,
    seed: Annotated[int, typer.Option()] = 0,
    workers: Annotated[int, typer.Option(help="worker processes, 0 = one per core")] = 0,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="simulate every rate; by default a policy stops after failing at two "
            "consecutive rates (once both sustainable rates are settled)",
        ),
    ] = False,
    at: Annotated[float | None, typer.Option(help="rate for the detail columns")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the result here")] = None,
    plot_out: Annotated[Path | None, typer.Option("--plot", help="write the plot here")] = None,
    markdown_out: Annotated[
        Path | None, typer.Option("--markdown", help="write the table as Markdown here")
    ] = None,
) -> None:
    """Sweep policies x arrival rates in the simulator; print a table, write JSON and a plot."""
    from interlude.bench.report import markdown_table, plot, report_rate, summary_table
    from interlude.bench.sweep import REFERENCE_POLICY, SweepSpec, parse_rates

    try:
        names = tuple(POLICIES) if policies == "all" else tuple(policies.split(","))
        spec = SweepSpec(
            workload,
            profile,
            names,
            parse_rates(rates),
            duration,
            seed,
            workers,
            full,
            compiled=_use_compiled(),
        )
        load_profile(profile)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    result = _sweep_with_progress(spec, REFERENCE_POLICY in spec.policies)
    detail_rate = at if at is not None else report_rate(result)
    console.print(summary_table(result, detail_rate))
    how = (
        "the compiled simulator"
        if spec.compiled
        else "pure Python; `interlude bench compile` makes it about 1.6x faster"
    )
    console.print(f"sweep took {result['wall_s']:.1f} s wall ({how})")
    if json_out is not None:
        _write(json_out, json.dumps(result, indent=1))
    if plot_out is not None:
        plot(result, plot_out)
        console.print(f"wrote {plot_out}")
    if markdown_out is not None:
        _write(markdown_out, markdown_table(result, detail_rate))


def _sweep_with_progress(spec: SweepSpec, has_reference: bool) -> dict[str, Any]:
    """`run_sweep` under a progress display: a live bar on a terminal; in a log (CI, a pipe)
    one line per finished run instead. A sweep that turns out invalid is a bad parameter."""
    from interlude.bench.sweep import run_sweep

    reference = 0 if has_reference else 1  # the reference policy runs at the lowest rate
    total = len(set(spec.rates)) * len(spec.policies) + reference
    columns = (*Progress.get_default_columns()[:1], BarColumn(), MofNCompleteColumn())
    live = console.is_terminal
    with Progress(*columns, TimeElapsedColumn(), console=console, disable=not live) as bar:
        task = bar.add_task("simulating", total=total)
        done = 0

        def tick(point: dict[str, Any]) -> None:
            nonlocal done
            done += 1
            label = f"{point['policy']} @ {point['rate']}"
            bar.update(task, advance=1, description=label)
            if live:
                return
            if point.get("skipped"):
                console.print(f"[{done}/{total}] {label} req/s: skipped (failed twice below)")
            else:
                console.print(
                    f"[{done}/{total}] {label} req/s: normalized latency "
                    f"{float(point['normalized_latency_median']) * 1000:.1f} ms/token "
                    f"({float(point['wall_s']):.1f} s)"
                )

        try:
            return run_sweep(spec, tick)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None


def _write(path: Path, text: str) -> None:
    """Write one of the sweep's outputs, its folder made first, and say so."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    console.print(f"wrote {path}")


def bench_report(
    result_json: Annotated[Path, typer.Argument(help="a JSON written by `bench sim --json`")],
    at: Annotated[float | None, typer.Option(help="rate for the detail columns")] = None,
    markdown: Annotated[bool, typer.Option(help="print Markdown instead of a table")] = False,
    plot_out: Annotated[Path | None, typer.Option("--plot", help="redraw the plot here")] = None,
) -> None:
    """Show a saved sweep again: the table (or Markdown) at any rate, and the plot."""
    from interlude.bench.report import markdown_table, plot, report_rate, summary_table

    try:
        result = json.loads(result_json.read_text())
        rate = at if at is not None else report_rate(result)
        table = markdown_table(result, rate) if markdown else summary_table(result, rate)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise typer.BadParameter(f"{result_json}: not a sweep result ({exc!r})") from None
    if isinstance(table, str):
        typer.echo(table)  # plain text: no wrapping, ready to paste
    else:
        console.print(table)
    if plot_out is not None:
        plot(result, plot_out)
        console.print(f"wrote {plot_out}")


def bench_bound(
    workload: Workload = "auto",
    profile: ProfileName = "gptj-6b-a100-40g",
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """The arrival rates no policy can sustain on a workload (bench/bound.py): work and
    memory alone, with every tool call's KV kept, swapped or recomputed at least cost, and
    that with the profile's host memory."""
    from interlude.bench.bound import (
        calls_rate_bound,
        demand,
        host_rate_bound,
        own_pool,
        rate_bound,
    )
    from interlude.bench.sweep import resolve_pool

    try:
        pool, p = resolve_pool(workload, seed), load_profile(profile)
    except (OSError, ValueError, KeyError) as exc:
        raise typer.BadParameter(str(exc)) from None
    d = demand(own_pool(p, pool)[0])  # shared heads are the group's, not each request's
    console.print(
        f"{workload} ({len(pool)} requests: {d.tokens:,.0f} tokens of their own, "
        f"{d.decode_token_iterations:,.0f} decode token-iterations each) on {profile}: "
        f"no policy sustains {rate_bound(p, pool):.2f} req/s (work and memory), "
        f"{calls_rate_bound(p, pool):.2f} req/s (with the calls), "
        f"{host_rate_bound(p, pool):.2f} req/s (with the calls and the host's memory)"
    )
