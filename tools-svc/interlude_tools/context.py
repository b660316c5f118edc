"""What a tool may know besides its arguments: the call it is answering, and the worker's setup.

A tool's `run` gets only the call's arguments; a tool with per-session state (the text
environment) or that reports whose call it runs reads `current_call()`. Tools built by a
factory (an entry point, the config file) get a `ToolEnv`: the worker's settings, so a tool
that keeps state in Redis uses the bus's server and needs no settings of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from interlude.api.bus import ToolCall
from interlude.api.redis_url import SCHEMES as REDIS_URL_SCHEMES

_CALL: ContextVar[ToolCall] = ContextVar("interlude_tool_call")


def current_call() -> ToolCall:
    """The call whose tool is running in this task; LookupError outside a tool's `run`."""
    return _CALL.get()


@contextmanager
def answering(call: ToolCall) -> Iterator[None]:
    """Make `call` the current call for the block (the registry wraps each run in it)."""
    token = _CALL.set(call)
    try:
        yield
    finally:
        _CALL.reset(token)


@dataclass(frozen=True)
class ToolEnv:
    """What a tool factory is given to build its tools."""

    # The tool bus's server: tools that keep state (per session) keep it here too.
    redis_url: str
    # The directory relative paths in the config file are read from (the file's own).
    base_dir: Path = Path()

    def __post_init__(self) -> None:
        if not self.redis_url.startswith(REDIS_URL_SCHEMES):
            raise ValueError(
                f"redis_url must be a redis://, rediss:// or unix:// URL, got {self.redis_url!r}"
            )
