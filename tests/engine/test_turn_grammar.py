"""TurnGrammars: each streaming-input update's grammar reaches its own turn (real vLLM
`Request`s, no engine; the end-to-end check is tests/gateway/test_structured.py)."""

from __future__ import annotations

from vllm import SamplingParams
from vllm.sampling_params import StructuredOutputsParams
from vllm.v1.request import Request, RequestStatus, StreamingUpdate

from interlude.enginecore.turn_grammar import GRAMMAR_WAIT, TurnGrammars

JSON = StructuredOutputsParams(json={"type": "object"})


def _request(grammar: StructuredOutputsParams | None, resumable: bool = True) -> Request:
    params = SamplingParams(max_tokens=4, structured_outputs=grammar)
    return Request("s", [1, 2], params, None, resumable=resumable)


def _applied(session: Request, update: Request) -> StreamingUpdate:
    """What vLLM's `_update_request_as_session` leaves: the update's params, status WAITING."""
    u = StreamingUpdate.from_request(update)
    assert u is not None
    session.sampling_params = u.sampling_params
    session.status = RequestStatus.WAITING
    return u


def test_an_updates_grammar_replaces_the_first_turns() -> None:
    grammars = TurnGrammars()
    session = _request(JSON)
    first = session.structured_output_request
    update = _request(StructuredOutputsParams(json={"type": "array"}))
    grammars.note(session, update)
    grammars.install(session, _applied(session, update))
    assert session.structured_output_request is update.structured_output_request
    assert session.structured_output_request is not first
    # It waits for its grammar as a new request does (vLLM promotes it once compiled).
    assert session.status == GRAMMAR_WAIT


def test_an_update_without_a_grammar_frees_the_turn() -> None:
    grammars = TurnGrammars()
    session = _request(JSON)
    update = _request(None)
    grammars.note(session, update)
    grammars.install(session, _applied(session, update))
    assert session.structured_output_request is None
    assert session.status == RequestStatus.WAITING


def test_queued_updates_keep_their_own_grammars() -> None:
    grammars = TurnGrammars()
    session = _request(None)
    a, b = _request(JSON), _request(None)
    grammars.note(session, a)
    grammars.note(session, b)
    grammars.install(session, _applied(session, a))
    assert session.structured_output_request is a.structured_output_request
    grammars.install(session, _applied(session, b))
    assert session.structured_output_request is None


def test_a_new_request_and_the_closing_sentinel_are_not_noted() -> None:
    grammars = TurnGrammars()
    session = _request(JSON)
    grammars.note(None, session)  # the session's own first input
    grammars.note(session, _request(None, resumable=False))  # the end of its input stream
    update = _request(None)
    grammars.install(session, _applied(session, update))  # an update nobody noted
    assert session.structured_output_request is not None
    assert not grammars._pending
