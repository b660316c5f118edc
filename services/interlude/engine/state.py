"""A chat session's life in the engine: one ordered enum, so `state.finished` is a comparison.

Its lower-cased names are what `/v1/load` and `GET /v1/sessions/{id}` report.
"""

from __future__ import annotations

from enum import IntEnum


class SessionState(IntEnum):
    """A session's life in order; every state from FINISHED on is terminal."""

    QUEUED = 0  # accepted, not yet scheduled
    GENERATING = 1  # a turn is being generated
    AWAITING_TOOL = 2  # parked: a server-side tool runs on the bus
    AWAITING_CLIENT = 3  # parked: the client must post tool results (`resume`)
    FINISHED = 4  # ended normally (final answer, or a token/context/tool-call limit)
    FAILED = 5  # ended by an error (engine error, client deadline)
    CANCELLED = 6  # ended by `cancel` or a client that went away mid-leg

    @property
    def finished(self) -> bool:
        return self >= SessionState.FINISHED
