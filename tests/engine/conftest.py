"""Real vLLM (the CPU build) with a tiny random-weight Llama built offline, once per session.

Each test starts its own engine inside its own event loop (AsyncLLM binds to the loop it first
runs in) and shuts it down; starting one takes about 20 s on a 2-core machine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from interlude.engine.config import EngineConfig


@pytest.fixture(scope="session")
def with_engine(tiny_model: str) -> Callable[..., Any]:
    """Run `body(engine)` on a fresh engine of `EngineConfig(model=tiny_model, **kw)`."""
    from interlude.bench.scripted_engine import ScriptedEngine

    def run(body: Callable[[Any], Awaitable[Any]], tool_deadline_s: float = 60.0, **kw: Any) -> Any:
        kw.setdefault("num_gpu_blocks", 40)
        kw.setdefault("host_blocks", 64)
        engine = ScriptedEngine(
            EngineConfig(model=tiny_model, **kw), tool_deadline_s=tool_deadline_s
        )
        try:
            return asyncio.run(body(engine))
        finally:
            engine.shutdown()

    return run
