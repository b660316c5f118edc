"""Live sessions of one engine: submit, resume with client tool results, cancel.

Each session runs in its own task, pumping `ChatRunner.run` events into a queue; an HTTP call
streams one *leg* of that queue (until `Paused`, `Done` or `Failed`). The task outlives the
HTTP call while the session is paused for the client, so its KV stays parked in the engine
(where the policy decides to keep, swap or drop it) and `resume` continues the same request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from interlude.api.events import (
    LEG_END,
    Event,
    Failed,
    Paused,
    TextDelta,
    ToolCallEvent,
    ToolResultEvent,
)
from interlude.api.script import parse_script
from interlude.engine.chat import ChatRunner
from interlude.engine.chat_state import AnswerFormat, ClientAnswer, ClientTimeout, failed
from interlude.engine.request import ChatRequest, RequestError
from interlude.engine.state import SessionState
from interlude.engine.toolcalls import ToolCallRequest

log = logging.getLogger(__name__)


class UnknownSession(LookupError):
    """No live session has this id (HTTP 404)."""


class SessionConflict(RuntimeError):
    """The session exists but cannot take this call now (HTTP 409)."""


@dataclass
class LiveSession:
    """A session between submit and its end (mutable: owned by `SessionManager`)."""

    request: ChatRequest
    state: SessionState = SessionState.QUEUED
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    task: asyncio.Task[None] | None = None
    awaiting: tuple[str, ...] = ()  # call ids the client must answer
    answer: asyncio.Future[ClientAnswer] | None = None
    streaming: bool = False  # an HTTP call is reading a leg now


class SessionManager:
    """Owns the live sessions of one engine.

    Side effects: a task per session; cancelling aborts its vLLM request (freeing its KV).
    Invariants: a session id is live at most once; a leg is read by at most one caller; every
    session ends with exactly one `Done` or `Failed`, after which it is forgotten; `live(t)` is
    the number of tenant t's sessions whose task has not ended (the caps count these).
    """

    def __init__(self, runner: ChatRunner) -> None:
        self.runner = runner
        self.sessions: dict[str, LiveSession] = {}
        self._by_tenant: dict[str, int] = {}
        runner.client_wait = self._client_wait

    def submit(self, req: ChatRequest) -> AsyncIterator[Event]:
        """Start `req`; returns its first leg. RequestError / SessionConflict before starting."""
        if req.session_id in self.sessions:
            raise SessionConflict(f"session {req.session_id!r} is already live")
        prompt = self.runner.prompt_tokens(req)  # validates the length before anything starts
        live = LiveSession(req)
        self.sessions[req.session_id] = live
        live.task = asyncio.create_task(self._pump(live, prompt), name=f"session-{req.session_id}")
        tenant = req.tenant
        self._by_tenant[tenant] = self._by_tenant.get(tenant, 0) + 1
        # On the task, not in `_pump`: a task cancelled before it ran never enters `_pump`.
        live.task.add_done_callback(lambda _: self._ended(tenant))
        return self._leg(live)

    def live(self, tenant: str) -> int:
        """`tenant`'s sessions here that have not ended (running or parked)."""
        return self._by_tenant.get(tenant, 0)

    def _ended(self, tenant: str) -> None:
        left = self._by_tenant.get(tenant, 0) - 1
        if left > 0:
            self._by_tenant[tenant] = left
        else:
            self._by_tenant.pop(tenant, None)

    def resume(
        self,
        session_id: str,
        results: Sequence[Mapping[str, str]],
        max_tokens: int | None = None,
        script: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | None = None,
        answer_format: AnswerFormat | None = None,
    ) -> AsyncIterator[Event]:
        """Answer a paused session's client-side calls; returns the next leg.

        `max_tokens`, if given, is how many tokens the session may generate from here on;
        `script`, if given, a scripted session's calls from here on (`script.py`);
        `tool_choice`, if given: "auto" or "none", whether the model's calls are parsed from
        here on; "required" or a tool's name, the next turn is that call; `answer_format`, if
        given, what its answer follows from here on (RequestError, the session still paused,
        if vLLM cannot build that grammar).
        """
        live = self.get(session_id)
        if live.state != SessionState.AWAITING_CLIENT or live.answer is None or live.streaming:
            raise SessionConflict(
                f"session {session_id!r} is {live.state.name.lower()}, not waiting for results"
            )
        by_id = {r.get("tool_call_id"): r for r in results}
        if len(by_id) != len(results) or set(by_id) != set(live.awaiting):
            raise RequestError(
                f"results must answer exactly the calls {list(live.awaiting)}, "
                f"got {[r.get('tool_call_id') for r in results]}"
            )
        answered = [
            ToolResultEvent(cid, True, str(by_id[cid].get("content", ""))) for cid in live.awaiting
        ]
        steps = None
        if script is not None:
            if not live.request.scripted:
                raise RequestError("script: the session was not started with a script", "script")
            steps = parse_script(script, live.request.tools, max_tokens)
        if answer_format is not None and answer_format.schema is not None:
            tools_on = bool(live.request.tools) and tool_choice != "none"
            self.runner.check_answer(live.request, answer_format.schema, tools_on)
        answer = ClientAnswer(answered, max_tokens, steps, tool_choice, answer_format)
        live.answer.set_result(answer)
        return self._leg(live)

    async def cancel(self, session_id: str) -> None:
        live = self.get(session_id)
        if live.task is not None:
            live.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await live.task

    async def close(self) -> None:
        for session_id in list(self.sessions):
            with contextlib.suppress(UnknownSession):
                await self.cancel(session_id)

    def states(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for live in self.sessions.values():
            counts[live.state.name.lower()] = counts.get(live.state.name.lower(), 0) + 1
        return counts

    def get(self, session_id: str) -> LiveSession:
        """The live session `session_id`; UnknownSession if none."""
        live = self.sessions.get(session_id)
        if live is None:
            raise UnknownSession(f"no live session {session_id!r}")
        return live

    async def _client_wait(self, session_id: str, calls: Sequence[ToolCallRequest]) -> ClientAnswer:
        live = self.get(session_id)
        # `_pump` opened the wait when the `Paused` event passed; open it here if it did not.
        answer = live.answer or self._open_wait(live, tuple(c.id for c in calls))
        try:
            return await answer
        finally:
            live.answer, live.awaiting = None, ()
            live.state = SessionState.GENERATING

    @staticmethod
    def _open_wait(live: LiveSession, call_ids: tuple[str, ...]) -> asyncio.Future[ClientAnswer]:
        answer: asyncio.Future[ClientAnswer] = asyncio.get_running_loop().create_future()
        live.answer, live.awaiting, live.state = answer, call_ids, SessionState.AWAITING_CLIENT
        return answer

    async def _pump(self, live: LiveSession, prompt: list[int]) -> None:
        sid = live.request.session_id
        live.state = SessionState.GENERATING
        try:
            async for ev in self.runner.run(live.request, prompt):
                if isinstance(ev, TextDelta):
                    live.state = SessionState.GENERATING
                elif isinstance(ev, ToolCallEvent) and ev.side == "server":
                    live.state = SessionState.AWAITING_TOOL
                elif isinstance(ev, Paused):
                    # Before the event is seen: a resume right after it must find the wait open.
                    self._open_wait(live, ev.call_ids)
                await live.events.put(ev)
            live.state = SessionState.FINISHED
        except asyncio.CancelledError:
            live.state = SessionState.CANCELLED
            await live.events.put(Failed(sid, "cancelled", f"session {sid!r} was cancelled"))
            raise
        except Exception as exc:  # the session ends; the engine and other sessions go on
            if not isinstance(exc, ClientTimeout):
                log.exception("session %s failed", sid)
            live.state = SessionState.FAILED
            await live.events.put(failed(sid, exc))
        finally:
            self.sessions.pop(sid, None)

    async def _leg(self, live: LiveSession) -> AsyncIterator[Event]:
        live.streaming = True
        ended = False
        try:
            while True:
                ev = await live.events.get()
                yield ev
                if isinstance(ev, LEG_END):
                    ended = True
                    return
        finally:
            live.streaming = False
            if not ended and not live.state.finished and live.task is not None:
                # The caller went away mid-leg: nobody would read the rest, so free the KV.
                live.task.cancel()


__all__ = ["LiveSession", "Paused", "SessionConflict", "SessionManager", "UnknownSession"]
