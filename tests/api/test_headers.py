"""Who an engine thinks is asking (`tenant_of`) and what it may run (`tools_of`), and the engine
tags in tool-call ids."""

from __future__ import annotations

from interlude.api.engine import (
    GATEWAY_TOKEN_HEADER,
    TENANT_HEADER,
    TOOLS_HEADER,
    tenant_of,
    tools_of,
)
from interlude.api.names import call_tag, engine_tag, new_call_id


def test_without_a_token_the_tenant_header_is_taken_as_given() -> None:
    assert tenant_of({TENANT_HEADER: "acme"}, "") == "acme"
    assert tenant_of({}, "") == ""


def test_with_a_token_only_the_gateway_names_the_tenant() -> None:
    token = "s3cret"
    assert tenant_of({TENANT_HEADER: "acme", GATEWAY_TOKEN_HEADER: token}, token) == "acme"
    assert tenant_of({TENANT_HEADER: "acme"}, token) == ""  # a caller straight to the engine
    assert tenant_of({TENANT_HEADER: "acme", GATEWAY_TOKEN_HEADER: "guess"}, token) == ""


def test_only_the_gateway_narrows_the_tools_a_caller_may_run() -> None:
    token = "s3cret"
    gateway = {GATEWAY_TOKEN_HEADER: token}
    assert tools_of({**gateway, TOOLS_HEADER: "calculator, retrieval"}, token) == {
        "calculator",
        "retrieval",
    }
    assert tools_of({**gateway, TOOLS_HEADER: ""}, token) == frozenset()  # none
    assert tools_of(gateway, token) is None  # not named: every published tool
    # Not the gateway's request (a caller inside the cluster, past the keys): no tools.
    assert tools_of({TOOLS_HEADER: "calculator"}, token) == frozenset()
    assert tools_of({}, token) == frozenset()
    assert tools_of({GATEWAY_TOKEN_HEADER: "guess"}, token) == frozenset()
    assert tools_of({TOOLS_HEADER: "calculator"}, "") == {"calculator"}


def test_call_ids_carry_their_engines_tag_in_openais_shape() -> None:
    tags = {engine_tag(f"engine-{i}") for i in range(50)}
    assert len(tags) == 50 and all(len(t) == 8 for t in tags)
    ids = {new_call_id(engine_tag("engine-1")) for _ in range(100)}
    assert len(ids) == 100  # unique
    assert {call_tag(i) for i in ids} == {engine_tag("engine-1")}
    untagged = new_call_id()
    assert call_tag(untagged) is not None and len(untagged) == len(next(iter(ids)))
    assert call_tag("call_XYZ") is None and call_tag("toolu_0123") is None
