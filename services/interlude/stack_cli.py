"""The one-machine commands: `interlude up`, `interlude down` and `interlude demo`."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.status import Status

from interlude.stack.procs import Part
from interlude.stack.up import StackState
from interlude.ui import make_console

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
    redis_url: str, auth: bool, port: int, engine_port: int,
) -> StackState:  # fmt: skip
    from interlude.stack.procs import StartError
    from interlude.stack.up import StackConfig, up

    try:
        cfg = StackConfig(
            run_dir=run_dir.resolve(), engines=engines, model=model, policy=policy,
            blocks=blocks, redis_url=redis_url, auth=auth, port=port, engine_port=engine_port,
        )  # fmt: skip
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    with console.status("starting the stack") as status:
        try:
            state = up(cfg, _progress(status))
        except (StartError, RuntimeError) as exc:
            console.print(f"[red]interlude up failed:[/] {exc}")
            raise typer.Exit(1) from None
    console.print(f"[bold]Interlude is up[/]: {state.gateway}/v1 (OpenAI-compatible)")
    console.print(f"  API key: {state.api_key or 'none needed (auth is off on this machine)'}")
    console.print(f"  engines: {', '.join(state.engines)}; Redis: {state.redis_url}")
    console.print(f"  logs: {run_dir}/logs/  traces: {run_dir}/traces/")
    return state


def up_cmd(
    engines: Annotated[int, typer.Option(help="engine processes")] = 1,
    model: Annotated[
        str, typer.Option(help="local checkpoint dir, or 'tiny' (built offline)")
    ] = "tiny",
    policy: Annotated[
        str, typer.Option(help="the engines' KV policy ('none' = stock vLLM)")
    ] = "interlude",
    blocks: Annotated[int | None, typer.Option(help="cap on each engine's KV blocks")] = None,
    redis_url: Annotated[
        str, typer.Option(help="use this Redis instead of the embedded Valkey")
    ] = "",
    auth: Annotated[
        bool, typer.Option(help="require an API key (one is made and printed)")
    ] = False,
    port: Annotated[int, typer.Option(help="the gateway's port")] = 8000,
    engine_port: Annotated[int, typer.Option(help="the first engine's port")] = 8100,
    detach: Annotated[
        bool, typer.Option(help="return once ready; stop with `interlude down`")
    ] = False,
    run_dir: RunDir = Path(".interlude"),
) -> None:
    """Start Valkey, a tools worker, the engines and the gateway as local processes."""
    from interlude.stack.up import down

    _start(run_dir, engines, model, policy, blocks, redis_url, auth, port, engine_port)
    if detach:
        console.print("  stop it with: interlude down")
        return
    console.print("  Ctrl-C stops everything")
    stop = False

    def on_signal(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop:
        time.sleep(0.5)
    console.print(f"stopped: {', '.join(down(run_dir.resolve())) or 'nothing was running'}")


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
