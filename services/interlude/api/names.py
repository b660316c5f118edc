"""Names and identifiers every process agrees on: tool names, session ids, tool-call ids, and
the ranges a request's fields may take.

A tool-call id is issued by the engine that generated the call; clients echo it in their tool
results, so it is how a continuation finds its session.
"""

from __future__ import annotations

import hashlib
import re
import uuid

# OpenAI's function-name charset (plus dots); the forced-call grammar writes the name verbatim.
TOOL_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
# Session ids travel in URL paths, headers, vLLM request ids, bus messages and logs.
SESSION_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
# tool_choice as a string; any other value names a tool.
CHOICES = ("auto", "none", "required")
SEED_RANGE = (-(2**63), 2**63 - 1)  # what vLLM can carry to its engine core (int64)


_CALL_ID = re.compile(r"call_([0-9a-f]{8})[0-9a-f]{16}")


def engine_tag(engine_id: str) -> str:
    """The 8 hex digits that stand for an engine in the tool-call ids it issues."""
    return hashlib.sha256(engine_id.encode()).hexdigest()[:8]


def new_call_id(tag: str = "") -> str:
    """A fresh tool-call id in OpenAI's shape, "call_" and 24 hex digits, the first 8 of them
    the issuing engine's `engine_tag` (random without one). A continuation names its engine
    by the ids it answers, so the gateway routes it there without a lookup; a forged or stale
    id only reaches an engine that does not hold the session, which recomputes."""
    rest = uuid.uuid4().hex
    return f"call_{(tag or rest[24:])[:8]}{rest[:16]}"


def call_tag(call_id: str) -> str | None:
    """The engine tag inside a tool-call id of ours; None for any other id."""
    m = _CALL_ID.fullmatch(call_id)
    return m.group(1) if m else None
