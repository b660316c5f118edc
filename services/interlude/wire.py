"""The wire formats the engine and the gateway share: OpenAI's error envelope and SSE frames."""

from __future__ import annotations

import json
from typing import Any


def error_body(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error envelope: every error either service answers has this shape."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def sse(payload: dict[str, Any] | str) -> bytes:
    """One SSE frame; every frame ends with a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


SSE_DONE = sse("[DONE]")
