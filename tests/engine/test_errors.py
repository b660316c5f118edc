"""The engine service's error mapping, on its real app without an engine: only the caller's
mistakes are 400s; our own bugs are 500s that name an id, not their internals."""

from __future__ import annotations

import logging

import pytest
from fastapi.testclient import TestClient

from interlude.engine.config import EngineConfig
from interlude.engine.request import RequestError
from interlude.engine.server import ServiceConfig, make_app


@pytest.fixture()
def client() -> TestClient:
    # No `with`: the lifespan (which would load the engine) does not run.
    app = make_app(ServiceConfig(engine=EngineConfig(model="/nonexistent/tiny")))

    @app.get("/test/bug")
    async def bug() -> None:
        raise ValueError("secret internal detail")

    @app.get("/test/refused")
    async def refused() -> None:
        raise RequestError("messages[0].role is wrong", "messages[0].role")

    return TestClient(app, raise_server_exceptions=False)


def test_an_internal_value_error_is_a_500_with_an_id_and_no_internals(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="interlude.engine.server"):
        r = client.get("/test/bug")
    assert r.status_code == 500
    error = r.json()["error"]
    assert error["type"] == "server_error" and error["param"] is None
    assert "secret" not in r.text
    ref = error["message"].split()[2].rstrip(";")
    assert len(ref) == 12 and f"internal error {ref}" in error["message"]
    # The id finds the traceback in the log.
    logged = [rec for rec in caplog.records if ref in rec.getMessage()]
    assert logged and logged[0].exc_info is not None
    assert "secret internal detail" in str(logged[0].exc_info[1])


def test_a_request_error_is_a_400_naming_the_field(client: TestClient) -> None:
    r = client.get("/test/refused")
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": "messages[0].role is wrong",
        "type": "invalid_request_error",
        "param": "messages[0].role",
        "code": None,
    }


def test_bodies_are_checked_before_the_engine_is_needed(client: TestClient) -> None:
    """Pydantic's checks answer 400 naming the field even while the engine loads (503)."""
    user = [{"role": "user", "content": "hi"}]
    r = client.post("/v1/sessions", json={"messages": user, "server_tools": ["calculator"]})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "server_tools")
    r = client.post("/v1/sessions", json={"messages": user, "seed": 2**64})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "seed")
    r = client.post("/v1/sessions", json={"messages": user})
    assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable"


def test_with_a_gateway_token_the_session_api_refuses_callers_without_it() -> None:
    """Sessions are named by id alone there: with a token, only the deployment's own callers
    may start, resume, read or cancel one (403 before anything is looked up)."""
    from interlude.api.engine import GATEWAY_TOKEN_HEADER

    config = ServiceConfig(engine=EngineConfig(model="/nonexistent/tiny"), gateway_token="s3cret")
    c = TestClient(make_app(config), raise_server_exceptions=False)
    calls = [
        ("post", "/v1/sessions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("post", "/v1/sessions/sess-x/resume", {"results": [{"tool_call_id": "c", "content": ""}]}),
        ("delete", "/v1/sessions/sess-x", None),
        ("get", "/v1/sessions/sess-x", None),
    ]
    for method, path, body in calls:
        for headers in ({}, {GATEWAY_TOKEN_HEADER: "wrong"}):
            r = c.request(method, path, json=body, headers=headers)
            assert r.status_code == 403, (path, r.text)
            assert r.json()["error"]["type"] == "permission_error"
        # With the token: past the gate (no engine runs here: 503, not 403).
        r = c.request(method, path, json=body, headers={GATEWAY_TOKEN_HEADER: "s3cret"})
        assert r.status_code == 503, (path, r.text)
    # Without a token configured (one machine, or a NetworkPolicy), as before.
    plain = TestClient(make_app(ServiceConfig(engine=EngineConfig(model="/nonexistent/tiny"))))
    assert plain.get("/v1/sessions/sess-x").status_code == 503


def test_a_prefill_or_decode_role_needs_the_kv_link(client: TestClient) -> None:
    """Such an engine hands KV over: refused at start, and at run time a 400 naming `role`."""
    for role in ("prefill", "decode"):
        with pytest.raises(ValueError, match="needs the KV link"):
            ServiceConfig(engine=EngineConfig(model="/nonexistent/tiny"), role=role)
        r = client.put("/v1/role", json={"role": role})
        assert r.status_code == 400 and r.json()["error"]["param"] == "role"
        assert "needs the KV link" in r.json()["error"]["message"]
    assert client.put("/v1/role", json={"role": "mixed"}).status_code == 200
    linked = EngineConfig(model="/nonexistent/tiny", kv_link=True)
    assert ServiceConfig(engine=linked, role="decode").role == "decode"
