"""How the engine's HTTP service answers errors: every one in the OpenAI envelope
(`interlude.api.wire.error_body`), with the status each exception type maps to."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from interlude.api.openai import Unsupported
from interlude.api.wire import error_body
from interlude.engine.caps import TooManySessions
from interlude.engine.completions.routes import LegFailed
from interlude.engine.prefill import NoHostLink
from interlude.engine.request import RequestError
from interlude.engine.session_api import Forbidden
from interlude.engine.sessions import SessionConflict, UnknownSession


class Unavailable(RuntimeError):
    """The engine cannot take sessions now (HTTP 503)."""


def error_response(status: int, message: str, type_: Any, param: str | None = None) -> JSONResponse:
    """An OpenAI error envelope with `status`."""
    return JSONResponse(error_body(message, type_, param), status_code=status)


# Exception type -> (status, OpenAI error type), each answered with the exception's message.
_PLAIN: list[tuple[type[Exception], int, str]] = [
    # Only RequestError is the caller's fault: any other ValueError is our bug (500).
    (RequestError, 400, "invalid_request_error"),
    (Unsupported, 400, "invalid_request_error"),
    (UnknownSession, 404, "not_found_error"),
    (SessionConflict, 409, "conflict_error"),
    (Unavailable, 503, "unavailable"),
    (Forbidden, 403, "permission_error"),
    (NoHostLink, 409, "conflict_error"),
]


def install_error_handlers(app: FastAPI, log: logging.Logger) -> None:
    """Register `app`'s exception handlers: the plain mappings above, a request that fails
    validation (400, naming the first bad field), TooManySessions (429), LegFailed (504 on a
    timeout, else 502) and anything else (500 with a reference; its traceback goes to `log`)."""
    for exc_type, status, type_ in _PLAIN:

        def handle(
            _: Request, exc: Exception, status: int = status, type_: str = type_
        ) -> Response:
            return error_response(status, str(exc), type_, getattr(exc, "param", None))

        app.add_exception_handler(exc_type, handle)

    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(TooManySessions, _too_many)
    app.add_exception_handler(LegFailed, _leg_failed)

    def crashed(_: Request, exc: Exception) -> Response:
        ref = uuid.uuid4().hex[:12]
        log.error("internal error %s", ref, exc_info=exc)
        # The id finds the traceback in the log; internals are not the caller's business.
        return error_response(500, f"internal error {ref}; see the engine log", "server_error")

    app.add_exception_handler(Exception, crashed)


def _invalid(_: Request, exc: Exception) -> Response:
    """A body that fails validation: 400 naming the first bad field."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    first = errors[0] if errors else {}
    where = ".".join(str(x) for x in first.get("loc", ()) if x != "body") or None
    return error_response(
        400, f"{where or 'body'}: {first.get('msg', exc)}", "invalid_request_error", where
    )


def _too_many(_: Request, exc: Exception) -> Response:
    """A tenant over its session cap: 429 with retry-after."""
    assert isinstance(exc, TooManySessions)
    body = error_body(str(exc), "rate_limit_error", None, TooManySessions.code)
    # When one of the tenant's sessions ends is the client's doing, not ours to predict.
    return JSONResponse(body, status_code=429, headers={"retry-after": "1"})


def _leg_failed(_: Request, exc: Exception) -> Response:
    """A leg that failed upstream of the caller: 504 on a timeout, else 502."""
    assert isinstance(exc, LegFailed)
    return error_response(504 if exc.code == "timeout" else 502, str(exc), "server_error")
