"""The endpoint-picker protocol's messages, over Envoy's `ext_proc` v3 API.

Protocol (Gateway API Inference Extension, `docs/proposals/004-endpoint-picker-protocol`,
v1.0.0): the picker answers each request with its endpoints, "host:port" and comma-separated
in the order to try, both in the `x-gateway-destination-endpoint` header and under the same key
in the `envoy.lb` namespace of the response's dynamic metadata (the same value in both); the
proxy may restrict the choice to the endpoints it lists under
`x-gateway-destination-endpoint-subset` in the `envoy.lb.subset_hint` namespace of the request's
metadata. Nothing to route to: an immediate 503; shedding: an immediate 429.

How the body arrives is the proxy's configuration (`ProcessingRequest.protocol_config`, sent
with the first message): FULL_DUPLEX_STREAMED (what the protocol asks of pickers) streams it
without waiting, and the picker answers the headers only after the whole body, then sends the
body back; BUFFERED waits for an answer to the headers first and sends the body whole.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from envoy.config.core.v3 import base_pb2  # type: ignore[import-untyped]
from envoy.extensions.filters.http.ext_proc.v3 import (  # type: ignore[import-untyped]
    processing_mode_pb2,
)
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep  # type: ignore[import-untyped]
from envoy.type.v3 import http_status_pb2  # type: ignore[import-untyped]
from google.protobuf import struct_pb2

from interlude.gateway.refusals import Refusal
from interlude.picker.decide import Route

DESTINATION = "x-gateway-destination-endpoint"
SUBSET = "x-gateway-destination-endpoint-subset"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"

BodyMode = processing_mode_pb2.ProcessingMode
FULL_DUPLEX = BodyMode.FULL_DUPLEX_STREAMED
BUFFERED = BodyMode.BUFFERED
NO_BODY = BodyMode.NONE
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD

# xds-protos ships no type stubs: its messages are typed as what they are to mypy, Any.
Message = Any
ProcessingRequest = ep.ProcessingRequest
ProcessingResponse = ep.ProcessingResponse


def headers_of(message: Message) -> dict[str, str]:
    """An `HttpHeaders` message's headers, by lower-case name (Envoy sends `raw_value`)."""
    out: dict[str, str] = {}
    for h in message.headers.headers:
        value = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
        out[h.key.lower()] = value
    return out


def subset_of(request: Message) -> frozenset[str] | None:
    """The endpoints the proxy allows for this request, or None when it names no subset."""
    namespaces = request.metadata_context.filter_metadata
    if SUBSET_NAMESPACE not in namespaces:
        return None
    fields = namespaces[SUBSET_NAMESPACE].fields
    if SUBSET not in fields:
        return None
    value = fields[SUBSET]
    if value.HasField("list_value"):
        return frozenset(v.string_value for v in value.list_value.values if v.string_value)
    return frozenset(x.strip() for x in value.string_value.split(",") if x.strip())


def client_of(request: Message, headers: Mapping[str, str]) -> str:
    """The caller's address: the `source.address` attribute when the proxy sends it, else the
    address Envoy put in `x-envoy-external-address`; "" when neither is there."""
    for attrs in request.attributes.values():
        if "source.address" in attrs.fields:
            return str(attrs.fields["source.address"].string_value).rpartition(":")[0]
    return headers.get("x-envoy-external-address", "")


def _set(named: Mapping[str, str]) -> list[Message]:
    """Headers to set, each replacing any of its name the request already has."""
    return [
        base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key=k, raw_value=v.encode()), append_action=_OVERWRITE
        )
        for k, v in named.items()
    ]


def _mutation(route: Route, body_length: int | None) -> Message:
    endpoints = ",".join(route.endpoints)
    named = {DESTINATION: endpoints, **route.set_headers}
    if body_length is not None:
        # The body goes back as a new one (full duplex): its length must be stated again.
        named["content-length"] = str(body_length)
    return ep.HeaderMutation(set_headers=_set(named), remove_headers=list(route.remove_headers))


def _metadata(route: Route) -> struct_pb2.Struct:
    meta = struct_pb2.Struct()
    meta.update({LB_NAMESPACE: {DESTINATION: ",".join(route.endpoints)}})
    return meta


def routed_headers(route: Route, body_length: int | None = None) -> Message:
    """The answer to the request's headers that routes it (full duplex, or a request with no
    body); `body_length`: the body sent back after it, if any."""
    common = ep.CommonResponse(header_mutation=_mutation(route, body_length))
    return ep.ProcessingResponse(
        request_headers=ep.HeadersResponse(response=common), dynamic_metadata=_metadata(route)
    )


def routed_body(route: Route) -> Message:
    """The answer to a buffered body that routes its request (its headers are still held)."""
    common = ep.CommonResponse(header_mutation=_mutation(route, None))
    return ep.ProcessingResponse(
        request_body=ep.BodyResponse(response=common), dynamic_metadata=_metadata(route)
    )


def body_back(chunk: bytes, end: bool, response: bool = False) -> Message:
    """A body chunk sent back unchanged (full duplex: the proxy forwards only what comes back);
    `response`: of the response, else of the request."""
    common = ep.CommonResponse(
        body_mutation=ep.BodyMutation(
            streamed_response=ep.StreamedBodyResponse(body=chunk, end_of_stream=end)
        )
    )
    body = ep.BodyResponse(response=common)
    if response:
        return ep.ProcessingResponse(response_body=body)
    return ep.ProcessingResponse(request_body=body)


def refused(refusal: Refusal) -> Message:
    """An immediate answer to the client: the refusal's status and OpenAI error envelope."""
    named = {"content-type": "application/json", **refusal.headers}
    return ep.ProcessingResponse(
        immediate_response=ep.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=refusal.status),
            headers=ep.HeaderMutation(set_headers=_set(named)),
            body=json.dumps(refusal.body()).encode(),
            details=f"interlude_picker_{refusal.status}",
        )
    )


def passed(kind: str) -> Message:
    """Let this part of the exchange through untouched (`kind`: the ProcessingResponse field:
    request_headers, response_headers, request_body (buffered), response_body (not full
    duplex), request_trailers, response_trailers)."""
    if kind.endswith("trailers"):
        return ep.ProcessingResponse(**{kind: ep.TrailersResponse()})
    if kind.endswith("body"):
        return ep.ProcessingResponse(**{kind: ep.BodyResponse()})
    return ep.ProcessingResponse(**{kind: ep.HeadersResponse()})
