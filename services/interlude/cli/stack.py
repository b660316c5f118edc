"""The one-machine commands: `interlude up`, `interlude down` and `interlude demo`."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.status import Status

from interlude.ui import cores, exit_on_term, make_console

if TYPE_CHECKING:  # the stack's modules need the pods' extras: imported when a command runs
    from interlude.stack.pool import PoolConfig
    from interlude.stack.procs import Part, PartSpec
    from interlude.stack.supervise import Supervisor
    from interlude.stack.up import StackState

console = make_console()
RunDir = Annotated[Path, typer.Option(help="logs, traces and the stack's state file")]


def _progress(status: Status) -> Callable[[Sequence[Part]], None]:
    def tick(parts: Sequence[Part]) -> None:
        now = time.monotonic()
        shown = [
            f"{p.spec.name} [green]ready[/]"
            if p.ready_at is not None
            else f"{p.spec.name} [yellow]starting {now - p.started:.0f} s[/]"
            for p in parts
        ]
        status.update("  ".join(shown))

    return tick


def _start(
    run_dir: Path, engines: int, model: str, policy: str, blocks: int | None,
    redis_url: str, auth: bool, port: int, engine_port: int, rate_limit: str = "600/minute",
    host_blocks: int | None = None, started: list[Part] | None = None,
    emulate: str | None = None, benchmark_mode: bool = False, engine_cpus: str = "",
    roles: str = "", min_engines: int | None = None,
    spares: list[tuple[PartSpec, str]] | None = None,
) -> StackState:  # fmt: skip
    from interlude.stack.procs import StartError
    from interlude.stack.up import StackConfig, up

    try:
        cfg = StackConfig(
            run_dir=run_dir.resolve(), engines=engines, model=model, policy=policy,
            blocks=blocks, redis_url=redis_url, auth=auth, port=port, engine_port=engine_port,
            rate_limit=rate_limit, host_blocks=host_blocks, emulate=emulate,
            benchmark_mode=benchmark_mode,
            engine_cpus=tuple(engine_cpus.split("|")) if engine_cpus else (),
            roles=tuple(r.strip() for r in roles.split(",")) if roles else (),
            min_engines=min_engines,
        )  # fmt: skip
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    # A SIGTERM while starting must unwind through `up`, which stops what it started (and later
    # through the foreground loop or the demo's `finally`): each part is in its own process
    # group, so nobody else would stop them.
    signal.signal(signal.SIGTERM, exit_on_term)
    with console.status("starting the stack") as status:
        try:
            state = up(cfg, _progress(status), started, spares)
        except (StartError, RuntimeError) as exc:
            # The message holds a log's tail: print it as text, never as rich markup.
            console.print(f"[red]interlude up failed:[/] {escape(str(exc))}")
            raise typer.Exit(1) from None
        except (KeyboardInterrupt, SystemExit) as exc:  # Ctrl-C, or SIGTERM (`exit_on_term`)
            console.print("interrupted: every part that had started is stopped")
            raise typer.Exit(130 if isinstance(exc, KeyboardInterrupt) else 143) from None
    from interlude.bus.streams import redacted

    console.print(f"[bold]Interlude is up[/]: {state.gateway}/v1 (OpenAI-compatible)")
    console.print(f"  API key: {state.api_key or 'none needed (auth is off on this machine)'}")
    console.print(f"  engines: {', '.join(state.engines)}; Redis: {redacted(state.redis_url)}")
    console.print(f"  logs: {run_dir}/logs/  traces: {run_dir}/traces/")
    _say_cores(state.engine_cpus)
    if state.roles:
        console.print(f"  roles: {', '.join(state.roles)} (prefilled KV over host shared memory)")
    return state


def _say_cores(binds: list[str]) -> None:
    from interlude.stack.cpus import shared_cores

    if len(binds) < 2:
        return
    console.print("  engine cores: " + ", ".join(f"engine-{i} {b}" for i, b in enumerate(binds)))
    if shared := shared_cores(binds):
        console.print(
            f"  [yellow]engines share cores {shared}: each runs at what the others leave it "
            "(fewer cores than engines, or --engine-cpus overlaps)[/]"
        )


def up_cmd(
    engines: Annotated[int, typer.Option(help="engine processes")] = 1,
    model: Annotated[
        str, typer.Option(help="local checkpoint dir, or 'tiny' (built offline)")
    ] = "tiny",
    policy: Annotated[
        str, typer.Option(help="the engines' KV policy ('none' = stock vLLM)")
    ] = "interlude",
    blocks: Annotated[int | None, typer.Option(help="cap on each engine's KV blocks")] = None,
    host_blocks: Annotated[
        int | None, typer.Option(help="each engine's host swap pool, in blocks (default: 64)")
    ] = None,
    redis_url: Annotated[
        str, typer.Option(help="use this Redis instead of the embedded Valkey")
    ] = "",
    auth: Annotated[
        bool, typer.Option(help="require an API key (one is made and printed)")
    ] = False,
    port: Annotated[int, typer.Option(help="the gateway's port")] = 8000,
    engine_port: Annotated[int, typer.Option(help="engines take free ports from here up")] = 8100,
    detach: Annotated[
        bool, typer.Option(help="return once ready; stop with `interlude down`")
    ] = False,
    emulate: Annotated[
        str | None,
        typer.Option(help="engines on an emulated accelerator of this profile (the tiny model)"),
    ] = None,
    benchmark_mode: Annotated[
        bool,
        typer.Option(
            help="the gateway and engines take scripted tool calls (`interlude_script`), for "
            "load generators; never where clients are not trusted"
        ),
    ] = False,
    engine_cpus: Annotated[
        str,
        typer.Option(
            help="each engine's cores in vLLM's syntax, engines split by '|' (e.g. '0-3|4-7'); "
            "default: this machine's cores split evenly between the engines"
        ),
    ] = "",
    roles: Annotated[
        str,
        typer.Option(
            help="each engine's role, comma-separated: mixed, prefill or decode (e.g. "
            "'prefill,decode': the decode engine has new prompts prefilled by the prefill one, "
            "KV through host shared memory); default: all mixed"
        ),
    ] = "",
    min_engines: Annotated[
        int | None,
        typer.Option(
            help="scale the engines between this many and --engines by the operator's rule "
            "(foreground only; decisions in <run-dir>/pool.jsonl)"
        ),
    ] = None,
    scale_up_window: Annotated[
        float, typer.Option(help="with --min-engines: seconds the load must persist to add")
    ] = 15.0,
    scale_down_window: Annotated[
        float, typer.Option(help="with --min-engines: seconds it must stay low to remove")
    ] = 60.0,
    scale_targets: Annotated[
        str,
        typer.Option(
            help="with --min-engines: the EnginePool's targets, e.g. 'kvUsage=0.5,queueDepth=4' "
            "(default: the operator's, 0.85, 0.1 and 8)"
        ),
    ] = "",
    pool_metrics_port: Annotated[
        int, typer.Option(help="with --min-engines: serve the operator's metrics here; 0 = none")
    ] = 0,
    run_dir: RunDir = Path(".interlude"),
) -> None:
    """Start Valkey, a tools worker, the engines and the gateway as local processes."""
    from interlude.stack.procs import tail
    from interlude.stack.supervise import supervise, supervisor_for
    from interlude.stack.up import down

    if min_engines is not None and detach:
        raise typer.BadParameter("--min-engines scales from the foreground `up`: no --detach")
    pool = _pool_config(
        min_engines, engines, scale_up_window, scale_down_window, scale_targets
    )  # validated before anything starts
    parts: list[Part] = []
    spares: list[tuple[PartSpec, str]] = []
    state = _start(
        run_dir, engines, model, policy, blocks, redis_url, auth, port, engine_port,
        host_blocks=host_blocks, started=parts, emulate=emulate, benchmark_mode=benchmark_mode,
        engine_cpus=engine_cpus, roles=roles, min_engines=min_engines, spares=spares,
    )  # fmt: skip
    if detach:
        where = "" if run_dir == Path(".interlude") else f" --run-dir {run_dir}"
        console.print(f"  stop it with: interlude down{where}")
        return
    console.print("  Ctrl-C stops everything; a part that dies is started again")
    supervisor = supervisor_for(state, parts, _say)
    tick = _pool_tick(pool, state, parts, spares, supervisor, pool_metrics_port)
    gave_up = supervise(state, supervisor, tick=tick)
    if gave_up is not None:
        console.print(
            f"[red]{gave_up.name} exited {gave_up.exits} times within {gave_up.window_s:.0f} s"
            f" (last code {gave_up.code})[/]: not starting it again; its log"
            f" ({escape(gave_up.log)}) ends with:"
        )
        console.print(tail(Path(gave_up.log)), markup=False, highlight=False)
    console.print(f"stopped: {', '.join(down(run_dir.resolve())) or 'nothing was running'}")
    if gave_up is not None:
        raise typer.Exit(1)


def _pool_config(
    min_engines: int | None, engines: int, up_s: float, down_s: float, targets: str
) -> PoolConfig | None:
    if min_engines is None:
        return None
    if not 1 <= min_engines <= engines:
        raise typer.BadParameter(f"--min-engines must be within 1 and --engines ({engines})")
    from interlude.stack.pool import PoolConfig

    try:
        return PoolConfig.between(min_engines, engines, up_s, down_s, targets)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _pool_tick(
    pool: PoolConfig | None,
    state: StackState,
    parts: list[Part],
    spares: list[tuple[PartSpec, str]],
    supervisor: Supervisor,
    metrics_port: int,
) -> Callable[[], None]:
    """The local pool's pass, for the supervising loop (nothing without `--min-engines`)."""
    if pool is None:
        return lambda: None
    from interlude.stack.pool import LocalPool
    from interlude_operator import telemetry

    telemetry.serve(metrics_port)
    local = LocalPool.for_stack(pool, state, parts, spares, supervisor, _say)
    bounds = f"{pool.scaling.min_replicas}-{pool.scaling.max_replicas}"
    console.print(f"  engines scale {bounds} by the operator's rule; passes: {local.passes}")
    if metrics_port:
        console.print(f"  the pool's decisions: http://127.0.0.1:{metrics_port}/metrics")
    return local.tick


def _say(line: str) -> None:
    console.print(f"[yellow]{time.strftime('%H:%M:%S')} {escape(line)}[/]")


def down_cmd(run_dir: RunDir = Path(".interlude")) -> None:
    """Stop every part `interlude up` started (harmless when nothing runs)."""
    from interlude.stack.up import down

    stopped = down(run_dir.resolve())
    console.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


def demo_cmd(
    engines: Annotated[int, typer.Option(help="engine processes")] = 1,
    run_dir: RunDir = Path(".interlude"),
) -> None:
    """Bring the stack up, run a short agentic workload through the gateway, bring it down."""
    from interlude.demo import run_demo
    from interlude.stack.up import down

    state = _start(run_dir, engines, "tiny", "interlude", None, "", False, 8000, 8100)
    try:
        run_demo(state.gateway, state.api_key, state.engines, run_dir.resolve() / "traces", console)
    finally:
        console.print(f"stopped: {', '.join(down(run_dir.resolve()))}")


def bench_gateway(
    json_out: Annotated[Path, typer.Option("--json", help="write the results here")],
    rates: Annotated[str, typer.Option(help="req/s against the echo engine")] = "50,100,200",
    engine_rates: Annotated[str, typer.Option(help="req/s against the real engine")] = "2,5,10",
    duration: Annotated[float, typer.Option(help="seconds of arrivals per rate")] = 20.0,
    flood: Annotated[
        float,
        typer.Option(
            help="also measure each echo rate under this many wrong-secret requests/s for a "
            "real key id, from 250 loopback addresses (0: no flood)",
            min=0,
        ),
    ] = 0.0,
    tokens: Annotated[
        int,
        typer.Option(
            help="tokens per echo answer: 1 answers JSON; more stream one SSE chunk per token "
            "5 ms apart (the gateway's CPU per relayed chunk)",
            min=1,
        ),
    ] = 1,
    plot_out: Annotated[Path | None, typer.Option("--plot", help="default: next to --json")] = None,
    run_dir: RunDir = Path(".interlude-bench"),
) -> None:
    """The latency the gateway adds over calling the engine directly (p50/p99 per rate)."""
    import json
    import platform

    from interlude.bench.gateway_bench import plot
    from interlude.bench.gateway_run import echo_rows, engine_rows

    try:
        echo_rates = [float(r) for r in rates.split(",") if r]
        real_rates = [float(r) for r in engine_rates.split(",") if r]
    except ValueError:
        raise typer.BadParameter("rates are comma lists of numbers") from None
    machine = f"{platform.machine()}, {cores()} cores"
    signal.signal(signal.SIGTERM, exit_on_term)  # unwind through the stops below

    def tick(setup: str) -> Callable[[float, dict[str, Any]], None]:
        def show(rate: float, row: dict[str, Any]) -> None:
            flooded = ""
            if row["flood_rate"]:
                answers = ", ".join(f"{n} x {c}" for c, n in row["flood_answers"].items())
                flooded = f" under a {row['flood_rate']:g}/s wrong-secret flood ({answers})"
            console.print(
                f"{setup} {rate:g} req/s{flooded}: in gateway p50 "
                f"{row['in_gateway_p50_ms']:.2f} ms, p99 {row['in_gateway_p99_ms']:.2f} ms; "
                "end to end p50 "
                f"{row['direct_p50_ms']:.1f} ms direct vs {row['gateway_p50_ms']:.1f} ms via "
                f"the gateway ({row['requests']} requests, {row['errors']} errors); gateway "
                f"CPU {row['gateway_cpu_ms_per_request'] or 0:.2f} ms per request it answered"
                + (f" ({row['tokens']} tokens each)" if row["tokens"] > 1 else "")
            )

        return show

    result: dict[str, Any] = {"machine": machine, "duration_s": duration, "tokens": tokens}
    with console.status("echo engine: loading the gateway itself"):
        result["echo"] = echo_rows(
            run_dir.resolve() / "echo", echo_rates, duration, tick("echo"), flood, tokens
        )
    with console.status("real engine (tiny model, vLLM CPU)"):
        result["engine"] = engine_rows(
            run_dir.resolve() / "engine", real_rates, duration, tick("engine")
        )
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(result, indent=2))
    out_png = plot_out or json_out.with_suffix(".png")
    plot(result["echo"], result["engine"], out_png, machine)
    console.print(f"wrote {json_out} and {out_png}")
