"""`interlude bench sim-check`: the simulator against the real scheduler (bench/sim_check.py)."""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from interlude.ui import make_console, say, stderr_to_file

console = make_console()


def _say(line: str) -> None:
    say(console, line)


def bench_sim_check(
    json_out: Annotated[Path, typer.Option("--json", help="write the results here")],
    profile: Annotated[str, typer.Option(help="the device: a shipped profile or a JSON path")] = (
        "gptj-6b-a100-40g"
    ),
    policies: Annotated[str, typer.Option(help="comma list")] = "vllm,infercept,lamps,interlude",
    rates: Annotated[str, typer.Option(help="conversations/s: START:STOP:STEP or a list")] = (
        "8,12,16,20"
    ),
    duration: Annotated[float, typer.Option(help="seconds of arrivals (device clock)")] = 20.0,
    time_scale: Annotated[
        float, typer.Option(help="the trace's tool times are divided by this (both sides)")
    ] = 10.0,
    dilation: Annotated[
        float, typer.Option(min=1.0, help="run the emulated device this many times slower")
    ] = 3.0,
    workload: Annotated[str, typer.Option(help="shared | generated:NAME | FILE")] = "shared",
    slo_rate: Annotated[
        float, typer.Option(help="the SLO is 3x the simulator's vllm-v0 median at this rate")
    ] = 2.0,
    markup: Annotated[
        bool,
        typer.Option(
            "--markup",
            help="the chat template's tokens in every conversation, as `bench http` sends them",
        ),
    ] = False,
    reference_on_engine: Annotated[
        bool,
        typer.Option(
            "--reference-on-engine",
            help="also run vllm-v0 on the engine at --slo-rate: the engine's side judged by "
            "its own SLO too (as `bench http` judges its arms)",
        ),
    ] = False,
    sim_only: Annotated[
        bool, typer.Option("--sim-only", help="the simulator's side only (seconds)")
    ] = False,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume", help="keep the engine runs an interrupted check left in --json (same spec)"
        ),
    ] = False,
    plot: Annotated[Path | None, typer.Option(help="default: the JSON path, .png")] = None,
    seed: int = 0,
) -> None:
    """Each policy on the emulated engine, in-process, against the simulator with the same
    profile and the same conversations: latencies side by side and sustainable rates."""
    from interlude.bench.sim_check import CheckSpec, run_sim_check
    from interlude.bench.sim_check_report import markdown_rows, plot_sim_check, verdict_lines
    from interlude.bench.sweep import parse_rates
    from interlude.cli.loadgen import markup_of
    from interlude.engine.config import prepare_process_env
    from interlude.loadgen.markup import Markup

    try:
        spec = CheckSpec(
            profile=profile,
            policies=tuple(p.strip() for p in policies.split(",") if p.strip()),
            rates=parse_rates(rates),
            duration_s=duration,
            time_scale=time_scale,
            dilation=dilation,
            workload=workload,
            seed=seed,
            slo_rate=slo_rate,
            markup=markup_of("tiny", workload, seed) if markup else Markup(),
            reference_on_engine=reference_on_engine,
        )
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    done = _earlier_runs(json_out, spec) if resume else []
    prepare_process_env(quiet=True)
    rows: list[dict[str, Any]] = []

    def save_partial(row: dict[str, Any]) -> None:
        rows.append(row)
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps({"spec": asdict(spec), "rows": rows}, indent=2) + "\n")

    with stderr_to_file("interlude-sim-check-") as log, tempfile.TemporaryDirectory() as tmp:
        console.print(f"vLLM's own log lines go to {log}")
        result = run_sim_check(spec, Path(tmp), _say, save_partial, not sim_only, done)
    json_out.write_text(json.dumps(result, indent=2) + "\n")
    png = plot or json_out.with_suffix(".png")
    plot_sim_check(result, png)
    for line in markdown_rows(result) + verdict_lines(result):
        console.print(line, markup=False)
    console.print(f"wrote {json_out} and {png}")


def _earlier_runs(path: Path, spec: Any) -> list[dict[str, Any]]:
    """The engine rows a check of the same spec left in `path` (rates and policies may differ:
    only matching runs are kept)."""
    if not path.exists():
        return []
    earlier = json.loads(path.read_text())
    same = {k: v for k, v in asdict(spec).items() if k not in ("policies", "rates")}
    theirs = {k: earlier["spec"].get(k) for k in same}
    if json.loads(json.dumps(same)) != theirs:
        raise typer.BadParameter(f"{path} holds a check of another spec: {theirs}")
    return [r for r in earlier["rows"] if r["side"] == "engine"]
