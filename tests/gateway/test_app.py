"""The gateway app without engines: the error envelope, keys, limits and probes.

These run the real app in-process (FastAPI's TestClient); the engine-backed behaviour is in
`test_stack.py`, on real engines.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from interlude.gateway.app import make_app
from interlude.gateway.auth import create_key
from interlude.gateway.config import GatewayConfig

# Nothing listens here: the pool has no ready engine.
NOWHERE = "http://127.0.0.1:9"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def _client(**kw: Any) -> TestClient:
    config = GatewayConfig(engines=(NOWHERE,), health_interval_s=0.2, **kw)
    return TestClient(make_app(config))


@pytest.fixture(scope="module")
def open_client() -> Iterator[TestClient]:
    with _client(auth=False, rate_limit="", introspection=True) as c:
        yield c


def _envelope(r: Any, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


@pytest.mark.parametrize(
    ("body", "param"),
    [({"messages": CHAT["messages"]}, "model"), ({**CHAT, "model": 7}, "model")],
)
def test_what_routing_needs_is_checked_at_the_gateway(
    open_client: TestClient, body: dict[str, Any], param: str
) -> None:
    """The rest of a request is the engine's to check (`test_stack.py`, both ways)."""
    err = _envelope(open_client.post("/v1/chat/completions", json=body), 400)
    assert err["param"] == param
    assert err["type"] == "invalid_request_error"


def test_malformed_json_is_a_400(open_client: TestClient) -> None:
    r = open_client.post(
        "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    _envelope(r, 400)


def test_no_ready_engine_is_a_503_with_retry_after(open_client: TestClient) -> None:
    r = open_client.post("/v1/chat/completions", json=CHAT)
    _envelope(r, 503)
    assert r.headers["retry-after"] == "1"
    assert open_client.get("/ready").status_code == 503
    assert open_client.get("/health").json() == {"status": "ok"}
    assert open_client.get("/v1/models").json() == {"object": "list", "data": []}


def test_an_oversized_body_is_a_413() -> None:
    with _client(auth=False, rate_limit="", max_body_bytes=1000) as c:
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * 2000}]}
        _envelope(c.post("/v1/chat/completions", json=big), 413)


def test_keys_are_required_and_checked(tmp_path: Path) -> None:
    key, line = create_key("ci")
    (tmp_path / "keys").write_text(line + "\n")
    with _client(api_keys_file=str(tmp_path / "keys"), rate_limit="") as c:
        err = _envelope(c.get("/v1/models"), 401)
        assert err["code"] == "invalid_api_key"
        _envelope(c.get("/v1/models", headers={"authorization": "Bearer il-00000000-x"}), 401)
        assert c.get("/v1/models", headers={"authorization": f"Bearer {key}"}).status_code == 200
        assert c.get("/v1/models", headers={"api-key": key}).status_code == 200
        assert c.get("/health").status_code == 200  # probes need no key


def test_a_wrong_secret_flood_is_cheap_and_limited_per_address(tmp_path: Path) -> None:
    key, line = create_key("ci")
    key_id = key.split("-")[1]
    (tmp_path / "keys").write_text(line + "\n")
    wrong = {"authorization": f"Bearer il-{key_id}-{'x' * 32}"}  # a real id, a wrong secret
    with _client(api_keys_file=str(tmp_path / "keys"), rate_limit="") as c:
        codes = [c.get("/v1/models", headers=wrong).status_code for _ in range(25)]
        assert codes == [401] * 20 + [429] * 5  # FailedAttempts: 20 a minute per address
        r = c.get("/v1/models", headers=wrong)
        assert _envelope(r, 429)["code"] == "rate_limit_exceeded"
        assert int(r.headers["retry-after"]) >= 1
        # The right key still passes from the same address (many clients may share one).
        assert c.get("/v1/models", headers={"authorization": f"Bearer {key}"}).status_code == 200


def test_rate_limit_per_key_answers_429_with_retry_after() -> None:
    with _client(auth=False, rate_limit="3/minute") as c:
        codes = [c.get("/v1/models").status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        r = c.get("/v1/models")
        assert _envelope(r, 429)["code"] == "rate_limit_exceeded"
        assert int(r.headers["retry-after"]) >= 1


def test_openapi_document_lists_the_routes(open_client: TestClient) -> None:
    doc = open_client.get("/openapi.json").json()
    assert {"/v1/chat/completions", "/v1/models", "/health", "/ready", "/metrics"} <= set(
        doc["paths"]
    )
    # The gateway relays the body unread, but documents it: the engine's request model.
    body = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletionRequest")
    schemas = doc["components"]["schemas"]
    assert {"ChatCompletionRequest", "Message", "ToolDef"} <= set(schemas)


def test_redis_away_degrades_instead_of_failing() -> None:
    # Nothing listens on port 9: the limiter fails open.
    with _client(auth=False, rate_limit="5/minute", redis_url="redis://127.0.0.1:9/0") as c:
        assert c.get("/v1/models").status_code == 200
        tool_reply = [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "5"},
        ]
        r = c.post("/v1/chat/completions", json={**CHAT, "messages": tool_reply})
        _envelope(r, 503)  # no engine here; Redis being away is not a 500
        line = next(
            x
            for x in c.get("/metrics").text.splitlines()
            if x.startswith("interlude:gateway_store_errors_total")
        )
        assert float(line.split()[-1]) >= 2  # the limiter's two checks


def test_metrics_speak_openmetrics_to_a_scraper_that_asks(open_client: TestClient) -> None:
    """Prometheus asks for OpenMetrics to get exemplars (the latency panels' trace links)."""
    r = open_client.get("/metrics", headers={"accept": "application/openmetrics-text"})
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    assert r.text.rstrip().endswith("# EOF")
    plain = open_client.get("/metrics")
    assert plain.headers["content-type"].startswith("text/plain")
    assert "# EOF" not in plain.text


def test_the_api_document_and_engine_addresses_are_not_public_by_default() -> None:
    with _client(auth=False, rate_limit="") as c:
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert c.get(path).status_code == 404, path
        engines = c.get("/ready").json()["engines"]
        assert engines == [{"ready": False, "draining": False, "model": "", "role": "mixed"}]
    with _client(auth=False, rate_limit="", introspection=True) as c:
        assert c.get("/openapi.json").status_code == 200
        assert c.get("/ready").json()["engines"][0]["url"] == NOWHERE


def test_a_metrics_port_takes_metrics_off_the_api_port() -> None:
    import httpx

    from interlude.stack.valkey import free_port

    port = free_port()
    with _client(auth=False, rate_limit="", metrics_port=port) as c:
        assert c.get("/metrics").status_code == 404  # not on the port the world may reach
        scraped = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5.0)
        assert scraped.status_code == 200
        assert "interlude:gateway_engines" in scraped.text  # the pool's gauges, kept fresh
        om = httpx.get(
            f"http://127.0.0.1:{port}/metrics",
            headers={"accept": "application/openmetrics-text"},
            timeout=5.0,
        )
        assert om.text.rstrip().endswith("# EOF")
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5.0).status_code == 404
    with pytest.raises(ValueError, match="metrics_port"):
        GatewayConfig(engines=(NOWHERE,), auth=False, metrics_port=70000)
