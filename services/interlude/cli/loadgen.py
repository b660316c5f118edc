"""`interlude loadgen run | compare` and `interlude bench http` (docs/http-bench.md)."""

from __future__ import annotations

import json
import platform
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from interlude.extras import needs
from interlude.ui import cores, make_console

loadgen = typer.Typer(help="Load generator for OpenAI-compatible servers.", no_args_is_help=True)
console = make_console()


def machine() -> dict[str, Any]:
    return {"cores": cores(), "platform": platform.platform(), "when": time.strftime("%F %T %Z")}


def _tokenizer_dir(tokenizer: str) -> str:
    if tokenizer == "tiny":
        from interlude.engine.tiny_model import build_tiny_model

        return str(build_tiny_model())
    return tokenizer


def texts_for(tokenizer: str | None) -> Any:
    from interlude.loadgen.text import TextMaker

    if tokenizer is None:
        return TextMaker.estimated()
    return TextMaker.from_tokenizer(_tokenizer_dir(tokenizer))


def _with_markup(scale: Any, tokenizer: str | None, workload: str, seed: int) -> Any:
    """`scale` with its budget also counting the chat template's markup (needs the tokenizer;
    without a budget or a tokenizer `scale` is returned as it is)."""
    if scale.budget_tokens is None or tokenizer is None:
        return scale
    return replace(scale, markup=markup_of(tokenizer, workload, seed))


def markup_of(tokenizer: str, workload: str, seed: int) -> Any:
    """The chat template's `Markup` with `workload`'s tools declared, measured with the
    tokenizer (a model directory, or `tiny`)."""
    from interlude.loadgen.client import tool_name
    from interlude.loadgen.markup import measure
    from interlude.loadgen.plan import tool_kinds

    names = [tool_name(k) for k in tool_kinds(workload, seed)]
    return measure(_tokenizer_dir(tokenizer), names)


def _model_of(url: str) -> str:
    import httpx

    r = httpx.get(url.rstrip("/") + "/models", timeout=10)
    r.raise_for_status()
    return str(r.json()["data"][0]["id"])


class Bar:
    """A rich progress bar per rate on a terminal; a line per rate in a log."""

    def __init__(self) -> None:
        columns = (*Progress.get_default_columns()[:1], BarColumn(), MofNCompleteColumn())
        self.live = console.is_terminal
        self.bar = Progress(*columns, TimeElapsedColumn(), console=console, disable=not self.live)

    def __call__(self, label: str, _: object) -> Any:
        console.print(label) if not self.live else None
        task = self.bar.add_task(label, total=None)

        def tick(arrived: int, finished: int, total: int) -> None:
            self.bar.update(task, total=total, completed=finished)

        return tick


def _scale(preset: str) -> Any:
    from interlude.loadgen.plan import TINY, Scale

    if preset == "tiny":
        return TINY
    if preset == "none":
        return Scale()
    raise typer.BadParameter(f"--scale must be 'tiny' or 'none', got {preset!r}")


def _rates(text: str) -> tuple[float, ...]:
    from interlude.bench.sweep import parse_rates

    if text == "trace":
        return ()
    try:
        return parse_rates(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


@loadgen.command("run")
@needs("loadgen")
def run_cmd(
    url: Annotated[str, typer.Option(help="the server's OpenAI base URL, e.g. http://host/v1")],
    mode: Annotated[
        str, typer.Option(help="resubmit (any server), resume or server-tools (Interlude)")
    ] = "resubmit",
    arm: Annotated[str | None, typer.Option(help="name in the results (default: the mode)")] = None,
    model: Annotated[str | None, typer.Option(help="default: the server's first model")] = None,
    workload: Annotated[
        str, typer.Option(help="auto, shared, generated:NAME, a trace JSON or a .jsonl file")
    ] = "auto",
    rates: Annotated[
        str, typer.Option(help="conversations/s: a comma list, START:STOP:STEP, or 'trace'")
    ] = "1",
    duration: Annotated[float, typer.Option(help="seconds of arrivals per rate")] = 20.0,
    horizon: Annotated[float | None, typer.Option(help="seconds per run (2 x duration)")] = None,
    rounds: Annotated[int, typer.Option(min=1, help="repeat the whole sweep")] = 1,
    seed: Annotated[int, typer.Option()] = 0,
    scale: Annotated[str, typer.Option(help="tiny (as bench engine) or none")] = "none",
    tokenizer: Annotated[
        str | None, typer.Option(help="model dir or 'tiny': exact token counts (else 4 chars)")
    ] = None,
    calls: Annotated[
        str, typer.Option(help="script (the client places the calls) or model (it writes them)")
    ] = "script",
    tool_choice: Annotated[
        str,
        typer.Option(help="with --calls model: auto, or named / required (random-weight models)"),
    ] = "auto",
    json_out: Annotated[Path, typer.Option("--json", help="results JSON")] = Path(
        "loadgen-results.json"
    ),
    plot_out: Annotated[Path | None, typer.Option("--plot", help="metrics vs rate")] = None,
) -> None:
    """Replay a workload against one OpenAI-compatible server; write results (and a plot)."""
    import httpx

    from interlude.loadgen.client import Target
    from interlude.loadgen.report import plot, table_lines
    from interlude.loadgen.sweep import RunSpec, run_rates

    try:
        sized = _with_markup(_scale(scale), tokenizer, workload, seed)
        spec = RunSpec(workload, _rates(rates), duration, horizon, seed, sized)
        target = Target(url, model or _model_of(url), mode, calls=calls, tool_choice=tool_choice)
    except (ValueError, httpx.HTTPError) as exc:
        raise typer.BadParameter(str(exc)) from None
    name = arm or mode
    texts = texts_for(tokenizer)
    rows: list[dict[str, Any]] = []
    bar = Bar()
    with bar.bar:
        for k in range(rounds):
            rows += run_rates(name, target, spec, texts, run=k, progress=bar)
    meta: dict[str, Any] = {"command": "loadgen run", "url": url, "model": target.model}
    meta |= {"mode": mode, "calls": calls, "tool_choice": tool_choice}
    meta |= {"workload": workload, "duration_s": duration, "horizon_s": spec.horizon}
    _write(json_out, {"meta": meta | {"machine": machine()}, "rows": rows})
    for line in table_lines(rows):
        typer.echo(line)
    if plot_out is not None:
        plot(rows, plot_out, f"{name} ({mode})")
        console.print(f"wrote {plot_out}")


@loadgen.command("compare")
def compare_cmd(
    results: Annotated[list[Path], typer.Argument(help="results JSON files")],
    reference: Annotated[
        str | None, typer.Option(help="arm whose lowest-rate median sets the SLO")
    ] = None,
    plot_out: Annotated[Path | None, typer.Option("--plot", help="all curves on one plot")] = None,
) -> None:
    """Side-by-side table of runs (and sustainable rates at the SLO), curves on one plot."""
    from interlude.loadgen.report import by_arm, judge, plot, table_lines, verdict_lines

    try:
        rows = [r for p in results for r in _load(p)]
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    for line in table_lines(rows):
        typer.echo(line)
    ref = reference or ("vllm-noprefix" if "vllm-noprefix" in by_arm(rows) else rows[0]["arm"])
    try:
        verdict = judge(rows, ref)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    typer.echo("")
    typer.echo(f"sustainable conversations/s (median rule / tail rule), SLO set by {ref}:")
    for line in verdict_lines(verdict):
        typer.echo(line)
    if plot_out is not None:
        plot(rows, plot_out)
        console.print(f"wrote {plot_out}")


def _load(path: Path) -> list[dict[str, Any]]:
    from interlude.loadgen.report import load_rows

    return load_rows([path])


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    console.print(f"wrote {path}")


def bench_http(
    rates: Annotated[str, typer.Option(help="conversations/s, comma list or START:STOP:STEP")] = (
        "0.5,1,1.5,2,3,4"
    ),
    duration: Annotated[float, typer.Option(help="seconds of arrivals per rate")] = 20.0,
    rounds: Annotated[int, typer.Option(min=1, help="whole experiments, each with its SLO")] = 2,
    arms: Annotated[str, typer.Option(help="comma list")] = (
        "vllm-noprefix,vllm-prefix,vllm-prefix-sync,interlude"
    ),
    workload: Annotated[str, typer.Option(help="as `loadgen run`")] = "auto",
    blocks: Annotated[int, typer.Option(min=18, help="KV blocks of 32 tokens, every arm")] = 40,
    seed: Annotated[int, typer.Option()] = 0,
    json_out: Annotated[Path, typer.Option("--json")] = Path("docs/bench/http-sweep-cpu.json"),
    plot_out: Annotated[Path, typer.Option("--plot")] = Path("docs/bench/http-sweep-cpu.png"),
    logs: Annotated[Path, typer.Option(help="server logs")] = Path(".interlude/http-bench"),
    emulate: Annotated[
        str | None,
        typer.Option(
            help="every arm on this emulated accelerator (a profile): its KV capacity and batch "
            "limits, the trace's tokens unscaled; rates, --duration and times on its clock "
            "(docs/emulation.md)"
        ),
    ] = None,
    dilation: Annotated[
        float,
        typer.Option(
            min=1.0, help="with --emulate: run the device and the tools this many times slower"
        ),
    ] = 1.0,
    time_scale: Annotated[
        float,
        typer.Option(
            min=0.001,
            help="with --emulate: the trace's tool times divided by this (device clock); 10 "
            "runs the conversations `bench sim-check` runs",
        ),
    ] = 1.0,
    horizon: Annotated[
        float | None,
        typer.Option(
            help="seconds until a rate's run stops (default 2 x duration; with --emulate, the "
            "duration plus 1.2 x the most tool time a conversation spends)"
        ),
    ] = None,
    slo_ms: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            help="the SLO in ms/token (device clock with --emulate) instead of "
            "the reference arm's: go on from an earlier sweep at higher rates",
        ),
    ] = None,
    stream_interval: Annotated[
        int, typer.Option(min=1, help="tokens per streamed chunk, every arm's server alike")
    ] = 1,
) -> None:
    """Stock vLLM's OpenAI server (prefix caching off, on) vs the Interlude stack over HTTP:
    the tiny model, the same KV blocks, a rate sweep in rounds (docs/http-bench.md); with
    --emulate, on an emulated accelerator at the trace's own scale (docs/emulation.md)."""
    from interlude.bench.http_bench import ARMS, run_http_bench
    from interlude.bench.http_emulated import Emulation
    from interlude.loadgen.plan import TINY
    from interlude.loadgen.sweep import RunSpec

    names = tuple(arms.split(","))
    if unknown := set(names) - set(ARMS):
        raise typer.BadParameter(f"unknown arms {sorted(unknown)}; choose from {list(ARMS)}")
    emulation = None
    if emulate is not None:
        try:
            emulation = Emulation(emulate, dilation, time_scale)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        scale = emulation.scale()
    else:
        # As `bench engine` scales: a conversation fits half the pool (608 tokens for 40
        # blocks), here with the chat template's markup counted (docs/http-bench.md).
        scale = replace(TINY, budget_tokens=(blocks - 2) * 32 // 2)
        scale = _with_markup(scale, "tiny", workload, seed)
    spec = RunSpec(workload, _rates(rates), duration, horizon, seed, scale)
    if emulation is not None and horizon is None:
        spec = replace(spec, horizon_s=emulation.whole_horizon(spec))
        console.print(f"horizon: {spec.horizon:.0f} s on the device's clock (every tool call fits)")
    started = time.monotonic()
    bar = Bar()
    with bar.bar:
        result = run_http_bench(
            spec, names, rounds, blocks, logs, texts_for("tiny"), bar, console.print,
            emulation=emulation, slo=slo_ms / 1000 if slo_ms is not None else None,
            stream_interval=stream_interval,
        )  # fmt: skip
    result["meta"] |= {"machine": machine(), "wall_s": time.monotonic() - started}
    flags = [("rates", rates), ("duration", duration), ("rounds", rounds), ("horizon", horizon)]
    flags += [("arms", arms), ("slo-ms", slo_ms)]
    flags += [("stream-interval", stream_interval)] if stream_interval > 1 else []
    flags += [("emulate", emulate), ("dilation", dilation)] if emulate else []
    flags += [("time-scale", time_scale)] if emulate and time_scale != 1 else []
    result["meta"]["command"] = "interlude bench http " + " ".join(
        f"--{k} {v}" for k, v in flags if v is not None
    )
    _write(json_out, result)
    from interlude.loadgen.report import plot

    device = f"emulated {emulate} (x{dilation:g} slower)" if emulate else "tiny model"
    plot(result["rows"], plot_out, f"HTTP: stock vLLM vs Interlude, {device}, {cores()} cores")
    console.print(f"wrote {plot_out}")
    _print_http_result(result)


def _print_http_result(result: dict[str, Any]) -> None:
    """`bench http`'s tables: latency and rates by arm, the SLO verdict, the serving path's
    CPU per token and how soon resumed turns started."""
    from interlude.loadgen.report import table_lines, verdict_lines

    for line in [*table_lines(result["rows"]), "", *verdict_lines(result["verdict"])]:
        typer.echo(line)
    typer.echo("\nserving-path CPU per generated token, ms (median of rounds; by rate):")
    for arm, by_rate in result["serving_cpu_ms_per_token"].items():
        typer.echo(f"  {arm:18s} " + "  ".join(f"{r:g}/s: {ms:.3f}" for r, ms in by_rate.items()))
    if result["resume_start"]:
        from interlude.bench.resume_start import lines

        typer.echo(
            "\nresumed turns: the tool's answer at the scheduler -> their first step, by how the "
            "KV came back (median of rounds of each round's median):"
        )
        for line in lines(result["resume_start"]):
            typer.echo(line)
