"""Each turn of a streaming-input session gets its own grammar.

vLLM 0.32 compiles a request's structured-output grammar once, from its first input: a later
`StreamingInput` carries its own `SamplingParams.structured_outputs`, and the engine core even
compiles it (on the update's `Request`), but `Scheduler.add_request` keeps only the update's
tokens and parameters and drops that grammar. The session keeps the first turn's grammar for
good: once terminated it constrains nothing, and cut short it would constrain the next turn.

A resumed chat session needs the opposite: its answer turn, after tool results, must follow
the continuation request's `response_format`. `TurnGrammars` keeps the grammar each queued
update brought and installs it when vLLM applies that update (or clears the previous turn's
when the update brought none), so the turn waits for its grammar like a new request does
(`WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR`, which vLLM's waiting loop promotes once compiled).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from vllm.v1.request import Request, RequestStatus

GRAMMAR_WAIT = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR


class TurnGrammars:
    """Grammars of queued session updates, by request id.

    Side effects: `install` replaces `session.structured_output_request` and may set the
    session's status to `GRAMMAR_WAIT`. Invariant: an update's grammar is matched to that
    update by its `SamplingParams` object, so updates queued back to back keep their own.
    """

    def __init__(self) -> None:
        self._pending: dict[str, list[tuple[Any, Any]]] = defaultdict(list)

    def note(self, existing: Request | None, update: Request) -> None:
        """Before vLLM's `add_request(update)`: keep the grammar of a session's next input."""
        if existing is not None and update.resumable and update.sampling_params is not None:
            grammar = update.structured_output_request
            self._pending[update.request_id].append((update.sampling_params, grammar))

    def install(self, session: Request, update: Any) -> None:
        """After vLLM applied `update` to `session`: this turn's grammar, or none."""
        pending = self._pending.get(session.request_id)
        if not pending:
            return
        mine = [i for i, (params, _) in enumerate(pending) if params is update.sampling_params]
        if not mine:
            return
        grammar = pending.pop(mine[0])[1]
        if not pending:
            del self._pending[session.request_id]
        session.structured_output_request = grammar
        if grammar is not None and session.status == RequestStatus.WAITING:
            session.status = GRAMMAR_WAIT

    def forget(self, request_id: str) -> None:
        self._pending.pop(request_id, None)
