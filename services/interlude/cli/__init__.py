"""The `interlude` command line (`root.py`), one module per command group beside it."""

from interlude.cli.root import app, main

__all__ = ["app", "main"]
