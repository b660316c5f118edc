"""What both fronts answer before any engine does, in OpenAI's error envelope: one mapping from
what went wrong (a body routing cannot read, a caller denied, no engine, shedding) to a status,
an error type and code, so the gateway (`app`) and the endpoint picker (`interlude.picker`)
refuse alike."""

from __future__ import annotations

from dataclasses import dataclass, field

from interlude.api.openai import Unsupported
from interlude.api.wire import error_body
from interlude.gateway.guard import Denied
from interlude.gateway.placement import Shed
from interlude.gateway.roster import NoEngine

# The exceptions `refusal_of` maps: routing's refusals, raised before any engine is asked.
REFUSED = (Unsupported, Denied, NoEngine, Shed)


@dataclass(frozen=True)
class Refusal:
    """Answer the client at once with `status`, an OpenAI error envelope and `headers`."""

    status: int
    message: str
    type: str
    code: str | None = None
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, object]:
        return error_body(self.message, self.type, self.param, self.code)


def refusal_of(exc: Exception) -> Refusal:
    """The answer to one of `REFUSED`; TypeError for anything else (a bug, not a refusal)."""
    if isinstance(exc, Unsupported):
        return Refusal(400, str(exc), "invalid_request_error", param=exc.param)
    if isinstance(exc, Denied):
        limited = exc.status == 429
        type_ = "rate_limit_error" if limited else "authentication_error"
        code = "rate_limit_exceeded" if limited else "invalid_api_key"
        return Refusal(exc.status, str(exc), type_, code, headers=exc.headers)
    if isinstance(exc, NoEngine):
        if not exc.known_model:
            return Refusal(404, str(exc), "invalid_request_error", "model_not_found", "model")
        return Refusal(503, str(exc), "service_unavailable", headers={"retry-after": "1"})
    if isinstance(exc, Shed):
        retry = {"retry-after": str(exc.retry_after_s)}
        return Refusal(429, str(exc), "rate_limit_error", "overloaded", headers=retry)
    raise TypeError(f"not a refusal: {exc!r}")
