"""The `interlude` command line: one Typer app, and each command registered from the module
beside it that holds it (`cli/<command>.py`), imported only for what it runs."""

from __future__ import annotations

import sys

import typer

from interlude.cli import (
    chaos,
    engine,
    gateway,
    loadgen,
    pd,
    picker,
    placement,
    predictor,
    sim,
    simcheck,
    stack,
    toolbus,
)
from interlude.extras import extra_for, invoked, needs, say_missing
from interlude.policy import POLICIES, available_profiles, load_profile

app = typer.Typer(help="Interlude: serving for augmented LLM requests.", no_args_is_help=True)
bench = typer.Typer(help="Benchmarks.", no_args_is_help=True)
app.add_typer(bench, name="bench")
console = sim.console


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


bench.command("compile")(sim.bench_compile)
bench.command("sim")(sim.bench_sim)
bench.command("report")(sim.bench_report)
bench.command("bound")(sim.bench_bound)


# Each pod's commands need its extra (`interlude.extras`); the rest run on the base install.
# The commands live beside what they run and import it only when run.
STACK = ("engine", "gateway", "tools", "local")  # `interlude up`: every pod on this machine
app.command("profile")(needs("engine")(engine.profile))
app.command("engine")(needs("engine")(engine.engine))
bench.command("engine")(needs("engine")(engine.bench_engine))
app.command("gateway")(needs("gateway")(gateway.gateway))
app.add_typer(gateway.keys, name="keys")
app.command("picker")(needs("picker")(picker.picker))
app.command("up")(needs(*STACK)(stack.up_cmd))
app.command("down")(stack.down_cmd)  # stops what `up` started: no extra needed
app.command("demo")(needs(*STACK)(stack.demo_cmd))
bench.command("gateway")(needs(*STACK)(stack.bench_gateway))
bench.command("toolbus")(needs("tools", "local")(toolbus.bench_toolbus))
bench.command("chaos")(needs(*STACK, "loadgen")(chaos.bench_chaos))
bench.command("pool")(needs(*STACK, "loadgen")(chaos.bench_pool))
app.add_typer(loadgen.loadgen, name="loadgen")
app.add_typer(predictor.predictor, name="predictor")
bench.command("http")(needs(*STACK, "loadgen")(loadgen.bench_http))
bench.command("sim-check")(needs("engine")(simcheck.bench_sim_check))
bench.command("placement")(placement.bench_placement)
bench.command("pd")(pd.bench_pd)


@app.command(
    "operator",
    add_help_option=False,
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
@needs("operator")
def operator_cmd(ctx: typer.Context) -> None:
    """Run the EnginePool operator (kopf); flags as `python -m interlude_operator --help`."""
    from interlude_operator.__main__ import main

    raise typer.Exit(main(ctx.args))


bench.command("toolbus-faults")(needs("tools", "local")(toolbus.bench_toolbus_faults))


def main() -> None:
    """`interlude`: the app, where a module of an extra missing deep in a command (past what
    the command declared) still ends in one line and exit 2, not a traceback."""
    try:
        app()
    except ModuleNotFoundError as exc:
        extra = extra_for(exc)
        if extra is None:  # not an extra's module: a bug, shown whole
            raise
        sys.exit(say_missing(invoked(), (extra,), [exc.name or "?"]))
