"""A chat completion through the gateway: pick its engine, send the body, relay the answer.

The gateway reads a request's JSON once, for two things only: the `model` (which engines may
serve it) and the ids of the tool results it ends with. An engine writes its tag into every
tool-call id it issues (`api.names.new_call_id`), so a continuation names the engine that holds
its paused session and goes there with no lookup (`EngineRoster.by_tag`), across any number of
gateway replicas. Anything else, or a tag no ready engine has, goes to the better of two random
engines (`EngineRoster.choose`), which serves it by recompute if it was a continuation. The
engine's answer, JSON or SSE, is relayed as bytes: nothing happens per token here.

The engine is told who is asking (`api.engine.TENANT_HEADER`, the caller's key name), which
server-side tools its key may run (`TOOLS_HEADER`) and its caps (`CAPS_HEADER`), with the
gateway's token, so sessions stay with their tenant, a key runs only the tools it was given, and
each engine holds its live sessions and tool calls to the key's caps.

`interlude_script` (scripted tool calls) is refused here unless the gateway runs in benchmark
mode: the body is parsed for routing anyway, so the check is one dictionary lookup.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from opentelemetry import propagate

from interlude.api.engine import (
    CAPS_HEADER,
    GATEWAY_TOKEN_HEADER,
    PREFILL_HEADER,
    TENANT_HEADER,
    TOOLS_HEADER,
)
from interlude.gateway import metrics
from interlude.gateway.guard import Caller
from interlude.gateway.hint import Hint
from interlude.gateway.placement import Placement, place
from interlude.gateway.roster import EngineRoster, NoEngine
from interlude.gateway.upstream import Answer, EngineError, Upstream

log = logging.getLogger(__name__)

# Response headers of the engine's that reach the client (hop-by-hop ones never do);
# `retry-after` comes with an engine's 429 (a key's session cap).
_PASSED = ("content-type", "x-session-id", "retry-after")


class Relay:
    """Sends chat completions to engines and streams their answers back.

    Side effects: one engine request per try; metrics. Invariant: a body is sent to another
    engine only when the last one could not be reached (nothing of it was sent).
    """

    def __init__(
        self,
        pool: EngineRoster,
        upstream: Upstream,
        token: str,
        benchmark_mode: bool = False,
        shed_queue: float = 0.0,
    ) -> None:
        self.pool = pool
        self.upstream = upstream
        self.token = token
        self.benchmark_mode = benchmark_mode  # `interlude_script` passes (else a 400)
        self.shed_queue = shed_queue  # new sessions get a 429 beyond it (`placement.place`)

    async def open(
        self, hint: Hint, raw: bytes, incoming: Mapping[str, str], caller: Caller, started: float
    ) -> tuple[Answer, dict[str, str]]:
        """Send a chat completion's body to its engine: the engine's answer (body unread) and
        the headers the client gets with it. Raises one of `refusals.REFUSED` when routing
        refuses the request (nothing was sent to an engine). `started`: when the request came
        (perf_counter), for the gateway's own time in `server-timing`."""
        headers = self._headers(incoming, caller)
        response, waited = await self._send(hint, raw, headers)
        out = {k: response.headers[k] for k in _PASSED if k in response.headers}
        gateway_ms = (time.perf_counter() - started - waited) * 1000
        timing = f"gateway;dur={gateway_ms:.3f}, upstream;dur={waited * 1000:.3f}"
        if engine_timing := response.headers.get("server-timing"):
            timing += ", " + engine_timing
        out |= {**caller.headers, "server-timing": timing}
        return response, out

    async def _send(
        self, hint: Hint, raw: bytes, headers: Mapping[str, str]
    ) -> tuple[Answer, float]:
        """(response, seconds waited for it) from the first engine that answers."""
        tried: set[str] = set()
        while True:
            at = self._place(hint, frozenset(tried), len(raw) // 4)
            engine = at.engine
            if engine.url in tried:
                raise NoEngine(f"no engine for {hint.model!r} could be reached", True)
            tried.add(engine.url)
            sent = dict(headers)
            # A session placed anew on a decode engine (a continuation whose session is gone
            # included: it is recomputed) has its prompt prefilled on a prefill engine.
            if at.prefill is not None:
                sent[PREFILL_HEADER] = at.prefill.url
            t0 = time.perf_counter()
            try:
                response = await self.upstream.open(engine.url, raw, sent)
                return response, time.perf_counter() - t0
            except EngineError as exc:
                # Nothing was sent: another engine may still take it (a continuation is then
                # recomputed there). The poll decides whether this one leaves the pool.
                metrics.ROUTES.labels("retry").inc()
                log.warning("engine %s unreachable: %s", engine.url, exc)

    def _place(self, hint: Hint, avoid: frozenset[str], prompt_tokens: int) -> Placement:
        at = place(self.pool, hint, avoid, shed_queue=self.shed_queue, prompt_tokens=prompt_tokens)
        for route in at.routes:
            metrics.ROUTES.labels(route).inc()
        return at

    def _headers(self, incoming: Mapping[str, str], caller: Caller) -> dict[str, str]:
        headers = {"content-type": "application/json", TENANT_HEADER: caller.name}
        if caller.tools is not None:
            headers[TOOLS_HEADER] = ",".join(sorted(caller.tools))
        if caller.caps.capped:
            headers[CAPS_HEADER] = caller.caps.header()
        if self.token:
            headers[GATEWAY_TOKEN_HEADER] = self.token
        if alias := incoming.get("x-session-id"):
            headers["x-session-id"] = alias
        propagate.inject(headers)  # the request's server span (`chat_route`)
        return headers
