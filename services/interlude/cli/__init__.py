"""The `interlude` command line (`app.py`), one module per command group beside it."""

from interlude.cli.app import app, main

__all__ = ["app", "main"]
