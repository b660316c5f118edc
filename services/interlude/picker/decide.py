"""The picker's answer for one request: where it goes and with which headers, or why not.

The same choice as the gateway's (`gateway.placement.place`), plus what the endpoint-picker
protocol asks of a picker: the chosen engine and up to `fallbacks` more, best first (the proxy
tries them in order when one cannot be reached), only among the endpoints the proxy names when
it names a subset, 503 when no engine is ready, 429 when shedding. Refusals carry OpenAI's error
envelope, as the gateway's do.

The engines learn who is asking from headers the picker sets (`api.engine.TENANT_HEADER`, the
key's tools and caps, and the gateway token that makes an engine believe them); every other
`x-interlude-*` header a client sent is removed, so no caller can name a tenant, tools or a
prefill engine of its own. With API keys, the key itself is removed too: engines never see it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from interlude.api.engine import (
    CAPS_HEADER,
    GATEWAY_TOKEN_HEADER,
    PREFILL_HEADER,
    TENANT_HEADER,
    TOOLS_HEADER,
)
from interlude.gateway.guard import Caller, Denied, Guard
from interlude.gateway.hint import Hint
from interlude.gateway.placement import Placement, fallbacks, place
from interlude.gateway.refusals import REFUSED, Refusal, refusal_of
from interlude.gateway.roster import EngineRoster, EngineState, NoEngine, better
from interlude.picker.config import PickerConfig

_OURS = "x-interlude-"
_KEYS = ("authorization", "api-key")


@dataclass(frozen=True)
class Route:
    """Send the request to `endpoints[0]` ("host:port"), the rest in order if it cannot be
    reached, with `set_headers` set (replacing any the client sent) and `remove_headers` gone."""

    endpoints: tuple[str, ...]
    set_headers: dict[str, str] = field(default_factory=dict)
    remove_headers: tuple[str, ...] = ()
    routes: tuple[str, ...] = ()  # how it was chosen, for metrics (`Placement.routes`, "any")


# What the picker routes: the gateway's public API, nothing else. An engine also serves its
# session API, `/v1/load`, `/v1/prefill` and `PUT /v1/role` to the gateway and the operator;
# every request the picker routes carries the gateway token, so a path it let through would
# reach those with the token's trust.
ROUTES = (("POST", "/v1/chat/completions"), ("GET", "/v1/models"))


def refused_route(headers: Mapping[str, str]) -> Refusal | None:
    """A 404 (405 for another method on a route) unless the request's `:method` and `:path`
    are one of `ROUTES` (`/v1/models/<id>` included); None when it may pass."""
    method = headers.get(":method", "")
    path = headers.get(":path", "").split("?", 1)[0]
    known = False
    for allowed, route in ROUTES:
        if path == route or (route == "/v1/models" and path.startswith("/v1/models/")):
            if method == allowed:
                return None
            known = True
    if known:
        return Refusal(405, f"{method} is not allowed on {path}", "invalid_request_error")
    return Refusal(404, f"no route {path!r} here", "invalid_request_error", "not_found")


def address(url: str) -> str:
    """An engine's base URL as the "host:port" the protocol names endpoints by."""
    parts = urlsplit(url)
    if parts.port is not None:
        return parts.netloc.rpartition("@")[2]
    return f"{parts.netloc}:{443 if parts.scheme == 'https' else 80}"


class Decider:
    """Chooses engines for requests.

    Side effects: counts each chosen engine as sent one (`EngineRoster.pick`), and a failed key
    check against the caller's address (`Guard`). Invariant: a `Route` names only ready engines
    of the pool, in `subset` when one is given.
    """

    def __init__(self, pool: EngineRoster, config: PickerConfig, guard: Guard) -> None:
        """`guard`: with a key store for auth "keys", without one for the other modes (it
        then gives every caller the default tools and caps); never a rate limiter."""
        self.pool = pool
        self.config = config
        self.guard = guard

    async def decide(
        self,
        headers: Mapping[str, str],
        body: bytes | None,
        subset: frozenset[str] | None = None,
        client: str = "",
    ) -> Route | Refusal:
        """Where a request with these (lower-case) `headers` and `body` (None: it has none)
        goes, its method and path already allowed (`refused_route`, which the stream checks
        at the headers, before the body arrives); `subset`: the "host:port" endpoints the
        proxy allows (None: any); `client`: its address, when the proxy says."""
        if body is not None and len(body) > self.config.max_body_bytes:
            limit = self.config.max_body_bytes
            return Refusal(413, f"the body is over {limit} bytes", "invalid_request_error")
        try:
            caller = await self._caller(headers, client)
            within = self._within(subset)
            if body is None:
                return self._route(headers, caller, self._any(within), None, within)
            hint = Hint.of(body, self.config.benchmark_mode, "picker")
            at = place(
                self.pool,
                hint,
                within=within,
                shed_queue=self.config.shed_queue,
                prompt_tokens=len(body) // 4,
            )
        except REFUSED as exc:
            return refusal_of(exc)
        return self._route(headers, caller, at, hint.model, within)

    async def _caller(self, headers: Mapping[str, str], client: str) -> Caller:
        """The caller, by its key (auth "keys"), by the cluster gateway's header ("header"),
        or by its address ("none"); with the key's or the default tools and caps."""
        caller = await self.guard.admit(headers, client)
        if self.config.auth != "header":
            return caller
        name = headers.get(self.config.tenant_header, "").strip()
        if not name:
            raise Denied(401, f"no caller named: no {self.config.tenant_header} header")
        return replace(caller, name=name)

    def _within(self, subset: frozenset[str] | None) -> frozenset[str] | None:
        """The pool's engine URLs among the proxy's `subset` endpoints (None: no subset)."""
        if subset is None:
            return None
        return frozenset(url for url in self.pool.engines if address(url) in subset)

    def _any(self, within: frozenset[str] | None) -> Placement:
        """For a request without a body (`GET /v1/models`): the better of two of all ready
        engines that are not draining."""
        ready = [e for e in self.pool.ready() if within is None or e.url in within]
        if not ready:
            raise NoEngine("no engine is ready", True)
        ready = [e for e in ready if not e.draining]
        if not ready:
            raise NoEngine("every ready engine is draining", True)
        pair = ready if len(ready) == 1 else self.pool.rng.sample(ready, 2)
        return Placement(better(*pair) if len(pair) == 2 else pair[0], True, ("any",))

    def _route(
        self,
        headers: Mapping[str, str],
        caller: Caller,
        at: Placement,
        model: str | None,
        within: frozenset[str] | None,
    ) -> Route:
        more: list[EngineState] = []
        if model is not None and self.config.fallbacks:
            more = fallbacks(self.pool, at.engine, model, self.config.fallbacks, within)
        endpoints = tuple(address(e.url) for e in (at.engine, *more))
        sent = self._engine_headers(caller, at)
        removed = {h for h in headers if h.startswith(_OURS) and h not in sent}
        if self.config.auth == "keys":
            removed.update(h for h in _KEYS if h in headers)
        return Route(endpoints, sent, tuple(sorted(removed)), at.routes)

    def _engine_headers(self, caller: Caller, at: Placement) -> dict[str, str]:
        """What the engine is told: as the gateway tells it (`gateway.relay`)."""
        sent = {TENANT_HEADER: caller.name}
        if caller.tools is not None:
            sent[TOOLS_HEADER] = ",".join(sorted(caller.tools))
        if caller.caps.capped:
            sent[CAPS_HEADER] = caller.caps.header()
        if self.config.gateway_token:
            sent[GATEWAY_TOKEN_HEADER] = self.config.gateway_token
        if at.prefill is not None:
            sent[PREFILL_HEADER] = at.prefill.url
        return sent
