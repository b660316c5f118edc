"""Names and identifiers every process agrees on: tool names, session ids, tool-call ids, and
the ranges a request's fields may take.

A tool-call id is issued by the engine that generated the call; clients echo it in their tool
results, so it is how a continuation finds its session.
"""

from __future__ import annotations

import re
import uuid

# OpenAI's function-name charset (plus dots); the forced-call grammar writes the name verbatim.
TOOL_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
# Session ids travel in URL paths, headers, vLLM request ids, bus messages and logs.
SESSION_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
# tool_choice as a string; any other value names a tool.
CHOICES = ("auto", "none", "required")
SEED_RANGE = (-(2**63), 2**63 - 1)  # what vLLM can carry to its engine core (int64)


def new_call_id() -> str:
    """A fresh tool-call id, OpenAI's shape: "call_" and 24 hex digits."""
    return f"call_{uuid.uuid4().hex[:24]}"
