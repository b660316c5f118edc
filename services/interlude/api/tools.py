"""The published-tools contract: which tools a deployment runs server-side.

The Redis hash `KEY` maps a tool's name to a JSON entry
``{"description", "parameters" (JSON schema), "worker", "updated_at"}``. Workers publish their
tools when they start and refresh them every `REFRESH_S`; readers ignore entries older than
`TTL_S`, so the tools of a deployment whose workers are all gone stop being server-side within
a minute. `interlude.bus.published` reads and writes the hash; this module is the format alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KEY = "interlude:tools"
REFRESH_S = 10.0
TTL_S = 60.0
CACHE_S = 2.0  # how stale a reader's cached view may be (`PublishedTools`)


@dataclass(frozen=True)
class ToolSpec:
    """A published tool: what the model is told about it."""

    name: str
    description: str
    parameters: Mapping[str, Any]


def encode_entry(spec: ToolSpec, worker: str, now: float) -> str:
    """The hash value for `spec`, published by `worker` at `now` (epoch seconds)."""
    return json.dumps(
        {
            "description": spec.description,
            "parameters": dict(spec.parameters),
            "worker": worker,
            "updated_at": now,
        }
    )


def decode_entry(name: str, text: str | bytes, now: float, ttl_s: float = TTL_S) -> ToolSpec | None:
    """The spec of a hash entry refreshed within `ttl_s` of `now`; None when stale or malformed
    (a malformed entry publishes nothing)."""
    try:
        entry = json.loads(text)
        fresh = now - float(entry["updated_at"]) <= ttl_s
    except (ValueError, KeyError, TypeError):
        return None
    if not fresh:
        return None
    return ToolSpec(name, str(entry.get("description", "")), entry.get("parameters") or {})
