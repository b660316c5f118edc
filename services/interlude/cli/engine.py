"""The engine's commands: `interlude engine`, `interlude profile`, `interlude bench engine`.

Registered on the app in `root.py`; each imports vLLM only when it runs, so the rest of the
command line starts fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from interlude.policy import load_profile
from interlude.ui import make_console, say, stderr_to_file

console = make_console()


def profile(
    model: Annotated[str, typer.Option(help="model directory, or 'tiny' (built offline)")] = "tiny",
    out: Annotated[Path | None, typer.Option(help="profile JSON (default ./NAME.json)")] = None,
    name: Annotated[str | None, typer.Option(help="profile name (tiny: tiny-llama-cpu)")] = None,
    blocks: Annotated[int, typer.Option(help="cap on KV blocks; 0 = what memory allows")] = 48,
    host_blocks: Annotated[int, typer.Option(help="host swap pool, in blocks")] = 96,
    block_size: Annotated[int, typer.Option(help="tokens per KV block")] = 32,
    max_num_seqs: Annotated[int, typer.Option(help="vLLM max_num_seqs")] = 64,
    max_batched_tokens: Annotated[int, typer.Option(help="vLLM max_num_batched_tokens")] = 2048,
    dtype: Annotated[str, typer.Option(help="model dtype")] = "float32",
    reps: Annotated[
        int | None, typer.Option(help="repetitions per point, median kept (default 5; quick 2)")
    ] = None,
    quick: Annotated[bool, typer.Option(help="a few points only: a smoke test")] = False,
    note: Annotated[str, typer.Option(help="added to the sources, e.g. 'shared cores'")] = "",
) -> None:
    """Measure T_fwd, saturation, swap bandwidth and capacities on a real engine; write a profile.

    Defaults are the CPU engine benchmark's (48 blocks of 32 tokens, 96 host blocks).
    """
    import dataclasses
    import time

    from interlude.engine.config import EngineConfig, prepare_process_env
    from interlude.engine.tiny_model import build_tiny_model
    from interlude.profiling.build import QUICK, ProfileSpec, tables
    from interlude.profiling.profiler import run_profile

    prepare_process_env()
    started = time.monotonic()
    name = name or ("tiny-llama-cpu" if model == "tiny" else Path(model).name)
    try:
        spec = QUICK if quick else ProfileSpec()
        spec = dataclasses.replace(spec, reps=reps) if reps is not None else spec
        config = EngineConfig(
            model=str(build_tiny_model()) if model == "tiny" else model,
            policy=None,
            num_gpu_blocks=blocks or None,
            host_blocks=host_blocks,
            block_size=block_size,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_batched_tokens,
            dtype=dtype,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    live = console.is_terminal
    columns = (*Progress.get_default_columns()[:1], BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console, disable=not live) as bar:
        task = bar.add_task("starting the engine", total=None)

        def tick(label: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, description=label)
            if not live:
                console.print(f"[{done}/{total}] {label}")

        run, _ = run_profile(config, spec, name, tick, note)
    target = out or Path(f"{name}.json")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(run.profile.to_json())
    load_profile(str(target))  # what we wrote must load
    for table in tables(run):
        console.print(table)
    console.print(f"wrote {target} ({time.monotonic() - started:.0f} s)")


def engine(
    model: Annotated[str, typer.Option(help="model directory, or 'tiny' (built offline)")] = "tiny",
    policy: Annotated[
        str,
        typer.Option(
            help="policy name, your own as 'package.module:Class', or 'none' for stock vLLM"
        ),
    ] = "interlude",
    profile: Annotated[str, typer.Option(help="profile name or JSON path")] = "tiny-llama-cpu",
    blocks: Annotated[int | None, typer.Option(help="cap on GPU KV blocks")] = None,
    host_blocks: Annotated[int, typer.Option(help="host swap pool, in blocks")] = 64,
    max_num_seqs: Annotated[
        int | None, typer.Option(help="vLLM max_num_seqs (default: 64 on CPU, vLLM's on GPUs)")
    ] = None,
    max_model_len: Annotated[
        int | None, typer.Option(help="context limit (default: 4096 on CPU, the model's on GPUs)")
    ] = None,
    max_num_batched_tokens: Annotated[
        int | None, typer.Option(help="tokens per step (default: 2048 on CPU, vLLM's on GPUs)")
    ] = None,
    dtype: Annotated[
        str, typer.Option(help="weights' dtype; auto: float32 on CPU, the model's on GPUs")
    ] = "auto",
    enforce_eager: Annotated[
        bool | None,
        typer.Option("--enforce-eager/--no-enforce-eager", help="default: eager on CPU only"),
    ] = None,
    gpu_memory_utilization: Annotated[
        float, typer.Option(help="share of GPU memory vLLM may use")
    ] = 0.9,
    tensor_parallel_size: Annotated[int, typer.Option(min=1, help="GPUs per engine")] = 1,
    stream_interval: Annotated[
        int,
        typer.Option(
            min=1, help="tokens per streamed chunk (vLLM's): fewer chunks, less CPU per token"
        ),
    ] = 1,
    tool_parser: Annotated[str, typer.Option(help="vLLM tool parser")] = "hermes",
    host: Annotated[str, typer.Option(help="listen address")] = "0.0.0.0",
    port: Annotated[int, typer.Option(help="listen port")] = 8100,
    redis_url: Annotated[
        str | None, typer.Option(help="tool bus (default INTERLUDE_REDIS_URL); '' = no bus")
    ] = None,
    engine_id: Annotated[str | None, typer.Option(help="name on the bus")] = None,
    client_deadline: Annotated[float, typer.Option(help="s a paused session waits")] = 300.0,
    max_tokens: Annotated[int, typer.Option(help="the most tokens a request may ask for")] = 8192,
    max_messages: Annotated[int, typer.Option(help="messages per chat completion")] = 1024,
    served_model_name: Annotated[
        str | None, typer.Option(help="the model's name in the API (default: its folder's)")
    ] = None,
    emulate: Annotated[
        str | None,
        typer.Option(
            help="run the tiny model on an emulated accelerator of this profile (its forward "
            "time, KV capacity, host pool and batch limits; engine/emulate.py)"
        ),
    ] = None,
    benchmark_mode: Annotated[
        bool | None,
        typer.Option(
            "--benchmark-mode/--no-benchmark-mode",
            help="take interlude_script and the session API's script (scripted tool calls, "
            "for load generators); default INTERLUDE_BENCHMARK_MODE, off",
        ),
    ] = None,
    kv_link: Annotated[
        bool,
        typer.Option(
            help="hand prefilled KV to, and take it from, engines on this host (prefill and "
            "decode roles; docs/disaggregation.md)"
        ),
    ] = False,
    kv_link_via: Annotated[
        str,
        typer.Option(
            help="host (shared memory, engines on one host) or nixl (vLLM's NIXL connector, "
            "GPUs across hosts)"
        ),
    ] = "host",
    kv_link_arena_gib: Annotated[
        float,
        typer.Option(
            min=0.001,
            help="host shared memory for prefilled prompts not yet taken by a decode engine "
            "(--kv-link-via host)",
        ),
    ] = 2.0,
    remote_prefill_min_tokens: Annotated[
        int, typer.Option(min=1, help="shorter new prompts are prefilled here (with --kv-link)")
    ] = 64,
    role: Annotated[
        str,
        typer.Option(help="mixed, prefill or decode (the last two need --kv-link); PUT /v1/role"),
    ] = "mixed",
) -> None:
    """Serve one engine: OpenAI's chat completions and the session API (engine/server.py)."""
    from interlude.engine.serve import serve, service_config

    if emulate is not None:
        from interlude.engine.emulate import emulated

        if model != "tiny":
            raise typer.BadParameter("--emulate runs the tiny model: leave --model out")
        emu = emulated(emulate)
        model, profile = str(emu.model_dir), emulate
        blocks = blocks or emu.blocks
        host_blocks = emu.host_blocks
        max_num_seqs = max_num_seqs or emu.max_num_seqs
        max_num_batched_tokens = max_num_batched_tokens or emu.max_num_batched_tokens

    config = service_config(
        model=model,
        policy=None if policy == "none" else policy,
        profile=profile,
        blocks=blocks,
        host_blocks=host_blocks,
        settings={
            "max_num_seqs": max_num_seqs,
            "max_model_len": max_model_len,
            "max_num_batched_tokens": max_num_batched_tokens,
            "dtype": dtype,
            "enforce_eager": enforce_eager,
            "gpu_memory_utilization": gpu_memory_utilization,
            "tensor_parallel_size": tensor_parallel_size,
            "kv_link": kv_link,
            "kv_link_via": kv_link_via,
            "kv_link_arena_gib": kv_link_arena_gib,
            "stream_interval": stream_interval,
        },
        tool_parser=tool_parser,
        port=port,
        redis_url=redis_url,
        engine_id=engine_id,
        client_deadline_s=client_deadline,
        served_model_name=served_model_name or ("tiny" if model == "tiny" else ""),
        max_tokens=max_tokens,
        max_messages=max_messages,
        benchmark_mode=benchmark_mode,
        remote_prefill_min_tokens=remote_prefill_min_tokens,
        role=role,
    )
    serve(config, host, port)


def bench_engine(
    json_out: Annotated[Path, typer.Option("--json", help="write the results here")],
    model: Annotated[
        str | None, typer.Option(help="model dir (default: build the tiny one)")
    ] = None,
    workload: Annotated[str, typer.Option(help="auto | shared | generated:NAME | FILE")] = "auto",
    rate: Annotated[float, typer.Option(help="sessions per second")] = 16.0,
    duration: Annotated[float, typer.Option(help="seconds of arrivals")] = 30.0,
    blocks: Annotated[int, typer.Option(help="KV blocks of 32 tokens (small: memory-bound)")] = 40,
    arms: Annotated[
        str,
        typer.Option(
            help="comma-separated arms, or 'all' (default: all; with --rates: stock and interlude)"
        ),
    ] = "",
    rates: Annotated[
        str | None,
        typer.Option(help="a rate sweep (START:STOP:STEP or a list): sustainable rates at the SLO"),
    ] = None,
    repeats: Annotated[int, typer.Option(min=1, help="rounds of all arms (runs vary)")] = 1,
    plot: Annotated[
        Path | None, typer.Option(help="write the plot here (default: the JSON path, .png)")
    ] = None,
    seed: int = 0,
    markup: Annotated[
        bool,
        typer.Option(
            "--markup/--no-markup",
            help="sessions also carry the chat template's tokens, as `bench http` sends them",
        ),
    ] = False,
) -> None:
    """Stock vLLM (resubmit per call, prefix caching on/off) vs our engine's policies: at one
    overloaded rate (throughput at saturation), or over --rates (sustainable rates at the SLO)."""
    from interlude.bench.engine_bench import ARMS, EngineBenchSpec, run_engine_bench
    from interlude.bench.engine_report import plot_engine
    from interlude.bench.engine_sweep import REFERENCE_ARM, SWEEP_ARMS
    from interlude.bench.sweep import parse_rates
    from interlude.cli.loadgen import markup_of
    from interlude.engine.config import prepare_process_env
    from interlude.engine.tiny_model import build_tiny_model
    from interlude.loadgen.markup import Markup

    if arms == "all" or (not arms and rates is None):
        chosen = list(ARMS)
    else:
        chosen = [a.strip() for a in arms.split(",")] if arms else list(SWEEP_ARMS)
    unknown = [a for a in chosen if a not in ARMS]
    if unknown:
        raise typer.BadParameter(f"unknown arms {unknown}; choose from {list(ARMS)}")
    try:
        swept = parse_rates(rates) if rates is not None else None
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--rates") from None
    if swept is not None and REFERENCE_ARM not in chosen:
        raise typer.BadParameter(f"a sweep needs {REFERENCE_ARM!r} (its lowest rate sets the SLO)")
    # The progress lines are the output; vLLM's log lines from every engine start are noise.
    prepare_process_env(quiet=True)
    model_dir = model or str(build_tiny_model())
    spec = EngineBenchSpec(
        model=model_dir,
        workload=workload,
        rate=rate,
        duration_s=duration,
        num_gpu_blocks=blocks,
        host_blocks=2 * blocks,
        seed=seed,
        markup=markup_of(model_dir, workload, seed) if markup else Markup(),
    )
    with stderr_to_file("interlude-bench-engine-") as log:
        console.print(f"vLLM's own log lines go to {log}")
        if swept is not None:
            png = plot or json_out.with_suffix(".png")
            _sweep_engine(spec, chosen, swept, repeats, json_out, png)
            return
        result = run_engine_bench(spec, chosen, _say, repeats)
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(result, indent=2) + "\n")
    png = plot or json_out.with_suffix(".png")
    plot_engine(result, png)
    console.print(_engine_table(result["summary"]))
    for stock, r in result["ratios"].items():
        verdict = "met" if r["ratio"] >= r["target"] else "NOT met"
        target = f"target {r['target']:g}x: {verdict}"
        console.print(f"interlude / {stock}: {r['ratio']:.2f}x finished/s ({target})")
    console.print(f"wrote {json_out} and {png}")


def _say(line: str) -> None:
    say(console, line)


def _sweep_engine(
    spec: Any, arms: list[str], rates: tuple[float, ...], repeats: int, out: Path, png: Path
) -> None:
    from interlude.bench.engine_report import plot_engine_sweep, sweep_lines
    from interlude.bench.engine_sweep import run_engine_sweep

    result = run_engine_sweep(spec, arms, rates, _say, repeats)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot_engine_sweep(result, png)
    for line in sweep_lines(result):
        console.print(line)
    console.print(f"wrote {out} and {png}")


def _engine_table(summary: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    def spread(r: dict[str, Any], key: str, fmt: str) -> str:
        lo, hi = r[f"{key}_range"]
        value = format(r[key], fmt)
        return value if r["runs"] == 1 else f"{value} ({lo:{fmt}}-{hi:{fmt}})"

    table = Table(
        "arm",
        "runs",
        "finished/s",
        "median s/token",
        "TTFT mean",
        "TTFT p99",
        "recomputed tok",
        "prefix hit rate",
        "finished",
    )
    for r in summary:
        table.add_row(
            r["arm"],
            str(r["runs"]),
            spread(r, "finished_per_s", ".3f"),
            spread(r, "median_norm_latency_s", ".4f"),
            spread(r, "ttft_mean_s", ".2f"),
            spread(r, "ttft_p99_s", ".2f"),
            f"{r['recomputed_tokens']:.0f}",
            f"{r['prefix_cache_hit_rate']:.2f}",
            f"{r['finished']:.0f}/{r['sessions']}",
        )
    return table
