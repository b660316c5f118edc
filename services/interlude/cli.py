"""The `interlude` command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from interlude.policy import POLICIES, available_profiles, load_profile

app = typer.Typer(help="Interlude: serving for augmented LLM requests.", no_args_is_help=True)
bench = typer.Typer(help="Benchmarks.", no_args_is_help=True)
app.add_typer(bench, name="bench")
# Tables are wide; when output is not a terminal (CI logs, pipes) do not wrap them at 80.
console = Console(width=None if sys.stdout.isatty() else 160)


@app.command("profiles")
def profiles() -> None:
    """List the shipped profiles and their key numbers."""
    for name in available_profiles():
        p = load_profile(name)
        console.print(
            f"[bold]{name}[/]: M={p.kv_bytes_per_token} B/token, T_fwd={p.fwd_a_ms}*n+"
            f"{p.fwd_c_ms} ms, S={p.saturation_tokens}, GPU KV={p.gpu_blocks} blocks "
            f"({p.gpu_blocks * p.block_size} tokens), CPU KV={p.cpu_blocks} blocks"
        )


@app.command("policies")
def policies() -> None:
    """List the policies and what each does."""
    for name, cls in POLICIES.items():
        console.print(f"[bold]{name}[/]: {cls.description}")


@bench.command("sim")
def bench_sim(
    workload: Annotated[
        str, typer.Option(help="trace JSON path, 'shared', 'generated:NAME' or 'auto'")
    ] = "auto",
    profile: Annotated[str, typer.Option(help="profile name or JSON path")] = "gptj-6b-a100-40g",
    policies: Annotated[str, typer.Option(help="comma list or 'all'")] = "all",
    rates: Annotated[str, typer.Option(help="START:STOP:STEP or a comma list")] = "0.5:4:0.25",
    duration: Annotated[float, typer.Option(help="simulated seconds of arrivals per rate")] = 1800,
    seed: Annotated[int, typer.Option()] = 0,
    workers: Annotated[int, typer.Option(help="worker processes, 0 = one per core")] = 0,
    at: Annotated[float | None, typer.Option(help="rate for the detail columns")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the result here")] = None,
    plot_out: Annotated[Path | None, typer.Option("--plot", help="write the plot here")] = None,
    markdown_out: Annotated[
        Path | None, typer.Option("--markdown", help="write the table as Markdown here")
    ] = None,
) -> None:
    """Sweep policies x arrival rates in the simulator; print a table, write JSON and a plot."""
    from interlude.bench.report import markdown_table, plot, report_rate, summary_table
    from interlude.bench.sweep import SweepSpec, parse_rates, run_sweep

    try:
        names = tuple(POLICIES) if policies == "all" else tuple(policies.split(","))
        spec = SweepSpec(workload, profile, names, parse_rates(rates), duration, seed, workers)
        load_profile(profile)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    total = len(spec.rates) * len(spec.policies) + (0 if "vllm" in spec.policies else 1)
    columns = (*Progress.get_default_columns()[:1], BarColumn(), MofNCompleteColumn())
    # A live bar on a terminal; in a log (CI, a pipe) one line per finished run instead.
    live = console.is_terminal
    with Progress(*columns, TimeElapsedColumn(), console=console, disable=not live) as bar:
        task = bar.add_task("simulating", total=total)
        done = 0

        def tick(point: dict[str, Any]) -> None:
            nonlocal done
            done += 1
            label = f"{point['policy']} @ {point['rate']}"
            bar.update(task, advance=1, description=label)
            if not live:
                console.print(
                    f"[{done}/{total}] {label} req/s: normalized latency "
                    f"{float(point['normalized_latency_median']) * 1000:.1f} ms/token "
                    f"({float(point['wall_s']):.1f} s)"
                )

        try:
            result = run_sweep(spec, tick)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
    detail_rate = at if at is not None else report_rate(result)
    console.print(summary_table(result, detail_rate))
    console.print(f"sweep took {result['wall_s']:.1f} s wall")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result, indent=1) + "\n")
        console.print(f"wrote {json_out}")
    if plot_out is not None:
        plot(result, plot_out)
        console.print(f"wrote {plot_out}")
    if markdown_out is not None:
        markdown_out.parent.mkdir(parents=True, exist_ok=True)
        markdown_out.write_text(markdown_table(result, detail_rate) + "\n")
        console.print(f"wrote {markdown_out}")


@bench.command("report")
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


@bench.command("engine")
def bench_engine(
    json_out: Annotated[Path, typer.Option("--json", help="write the results here")],
    model: Annotated[
        str | None, typer.Option(help="model dir (default: build the tiny one)")
    ] = None,
    workload: Annotated[str, typer.Option(help="auto | shared | generated:NAME | FILE")] = "auto",
    rate: Annotated[float, typer.Option(help="sessions per second")] = 2.0,
    duration: Annotated[float, typer.Option(help="seconds of arrivals")] = 30.0,
    blocks: Annotated[int, typer.Option(help="KV blocks of 32 tokens (small: memory-bound)")] = 48,
    arms: Annotated[str, typer.Option(help="comma-separated arms, or 'all'")] = "all",
    seed: int = 0,
) -> None:
    """Stock vLLM (resubmit per call, prefix caching on/off) vs our engine's policies."""
    from interlude.bench.engine_bench import ARMS, EngineBenchSpec, run_engine_bench
    from interlude.engine.config import prepare_process_env
    from interlude.engine.tiny_model import build_tiny_model

    chosen = list(ARMS) if arms == "all" else [a.strip() for a in arms.split(",")]
    unknown = [a for a in chosen if a not in ARMS]
    if unknown:
        raise typer.BadParameter(f"unknown arms {unknown}; choose from {list(ARMS)}")
    prepare_process_env()
    spec = EngineBenchSpec(
        model=model or str(build_tiny_model()),
        workload=workload,
        rate=rate,
        duration_s=duration,
        num_gpu_blocks=blocks,
        host_blocks=2 * blocks,
        seed=seed,
    )
    result = run_engine_bench(spec, chosen, lambda line: console.print(line))
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(result, indent=2) + "\n")
    console.print(_engine_table(result["rows"]))
    console.print(f"wrote {json_out}")


def _engine_table(rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table(
        "arm",
        "finished/s",
        "median s/token",
        "TTFT mean",
        "TTFT p99",
        "recomputed tok",
        "prefix hit rate",
        "finished",
    )
    for r in rows:
        table.add_row(
            r["arm"],
            f"{r['finished_per_s']:.3f}",
            f"{r['median_norm_latency_s']:.4f}",
            f"{r['ttft_mean_s']:.3f}",
            f"{r['ttft_p99_s']:.3f}",
            str(r["recomputed_tokens"]),
            f"{r['prefix_cache_hit_rate']:.2f}",
            f"{r['finished']}/{r['sessions']}",
        )
    return table


if __name__ == "__main__":
    app()
