"""An ASGI app on a real uvicorn server in a thread, for the gateway tests' engine stand-ins
and gateways that must run beside the test's own (blocking) clients."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import uvicorn


@contextmanager
def threaded_server(
    app: Any, port: int, lifespan: Literal["auto", "on", "off"] = "auto"
) -> Iterator[str]:
    """`app` served at `port` until the block ends; yields its URL."""
    config = uvicorn.Config(app, port=port, log_level="critical", lifespan=lifespan)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(5)
