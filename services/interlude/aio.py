"""`run`: asyncio.run on uvloop when it is installed.

The engine and the gateway run under uvicorn, which picks uvloop by itself; the tool workers and
the tool-bus benchmark run their own loops, and take the same one so that what the benchmark
times is what a deployment runs. uvloop's wake-ups are cheaper than the default loop's, which
is most of a sub-millisecond round trip.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
