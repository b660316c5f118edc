"""The terminal console every command prints through."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console

_TERM = [False]  # a SIGTERM arrived (`exit_on_term`)


def exit_on_term(*_: object) -> None:
    """A SIGTERM handler that unwinds like Ctrl-C, so a command's `finally` blocks stop what it
    started (servers, workers, engines) instead of leaving them behind. It also remembers the
    signal (`term_requested`): raised while a finalizer runs (`__del__`), the SystemExit is
    swallowed ("Exception ignored in ..."), so loops that must stop check the flag too."""
    _TERM[0] = True
    raise SystemExit(143)


def term_requested() -> bool:
    """Whether `exit_on_term` has run in this process."""
    return _TERM[0]


def cores() -> int:
    """CPU cores this process may run on (what a benchmark's numbers were measured with)."""
    return len(os.sched_getaffinity(0))


def make_console() -> Console:
    # Tables are wide; when output is not a terminal (CI logs, pipes) do not wrap them at 80.
    return Console(width=None if sys.stdout.isatty() else 160)


def say(console: Console, line: str) -> None:
    """Print a progress line as written: names in brackets (arms, tools) are not rich markup."""
    console.print(line, markup=False, highlight=False)


@contextlib.contextmanager
def stderr_to_file(prefix: str) -> Iterator[Path]:
    """Send this process's stderr, and that of the processes it starts, to a temporary file.

    vLLM's engine processes write log lines, warnings and load bars to the stderr they inherit
    (file descriptor 2, below Python's logging); a command whose output is its own progress
    lines keeps them out of the terminal this way. Yields the file's path (say where it is).
    """
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=".log")
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield Path(name)
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
