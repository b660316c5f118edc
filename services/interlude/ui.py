"""The terminal console every command prints through."""

from __future__ import annotations

import sys

from rich.console import Console


def make_console() -> Console:
    # Tables are wide; when output is not a terminal (CI logs, pipes) do not wrap them at 80.
    return Console(width=None if sys.stdout.isatty() else 160)
