"""The tools every worker runs besides the ones a tools file or entry points declare."""

from __future__ import annotations

from interlude_tools.context import ToolEnv
from interlude_tools.registry import Tool
from interlude_tools.tools.retrieval import Retrieval, RetrievalConfig
from interlude_tools.tools.textworld import TextWorld


def standard_tools(env: ToolEnv, retrieval: RetrievalConfig | None = None) -> list[Tool]:
    """`retrieval` (BM25 over the shipped corpus unless `retrieval` says otherwise; the index
    is built here, so this reads files and takes CPU: call it off the event loop) and
    `textworld` (its sessions' state in the bus's Redis; close it with `aclose`)."""
    return [Retrieval.from_env(env, retrieval), TextWorld(env)]
