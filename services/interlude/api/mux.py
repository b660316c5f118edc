"""The multiplexed link between a gateway and an engine: many HTTP exchanges over one WebSocket.

Over plain HTTP every relayed token costs a socket write in the engine, a read and a write in
the gateway, each with its event-loop wake-up; on a small machine these dominate the serving
path's CPU (docs/http-bench.md). Over the link, an engine writes the frames of every answer
that has something new in one WebSocket message (all its streams' tokens of one step
together), so the engine's per-token write and the gateway's per-token read are paid once per
step; the gateway still writes each client's tokens to that client, as any server must.

A WebSocket message holds whole frames, each `HEADER` (stream id, kind, payload length) and its
payload. The gateway numbers its streams; an exchange is `REQUEST` (gateway to engine), then
`START` once, `DATA` any number of times and `END` (engine to gateway). `CANCEL` (gateway to
engine) says the client left: the engine treats it as that exchange's disconnect. When the
WebSocket closes, every exchange still open on it is over: the engine's as disconnected, the
gateway's as broken.

No dependencies: the gateway and the engine both import this.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Mapping, Sequence
from enum import IntEnum

MUX_PATH = "/v1/mux"
# How a gateway may reach its engines: over this link, or an HTTP connection per request.
UPSTREAMS = ("mux", "http")
# stream id, kind, payload length; network order.
HEADER = struct.Struct("!IBI")
# A DATA payload is cut at this size, so a large JSON answer never makes one huge message.
MAX_DATA = 256 * 1024
# The largest WebSocket message either end accepts: a request's body (the gateway's limit is
# 4 MiB by default) and its headers, with room to spare.
MAX_MESSAGE = 64 * 1024 * 1024


class Kind(IntEnum):
    REQUEST = 1  # gateway to engine: `request_payload`
    START = 2  # engine to gateway: `start_payload`, once per exchange, first
    DATA = 3  # engine to gateway: response body bytes
    END = 4  # engine to gateway: the body is whole (no payload)
    CANCEL = 5  # gateway to engine: the client left (no payload)


class MuxError(ValueError):
    """A message that does not parse as frames, or a payload that is not what its kind holds."""


def frame(stream: int, kind: Kind, payload: bytes = b"") -> bytes:
    return HEADER.pack(stream, kind, len(payload)) + payload


def data_frames(stream: int, body: bytes) -> Iterator[bytes]:
    """`body` as DATA frames of at most `MAX_DATA` bytes each."""
    for at in range(0, len(body), MAX_DATA):
        yield frame(stream, Kind.DATA, body[at : at + MAX_DATA])


def frames(message: bytes) -> Iterator[tuple[int, Kind, bytes]]:
    """The (stream, kind, payload) of each frame in a message; MuxError if one is cut short or
    of an unknown kind (the frames before it are yielded first)."""
    at, size = 0, len(message)
    while at < size:
        if size - at < HEADER.size:
            raise MuxError(f"a frame header cut short at byte {at}")
        stream, kind, length = HEADER.unpack_from(message, at)
        at += HEADER.size
        if at + length > size:
            raise MuxError(f"stream {stream}: a payload of {length} bytes cut short")
        try:
            yield stream, Kind(kind), message[at : at + length]
        except ValueError:
            raise MuxError(f"stream {stream}: unknown frame kind {kind}") from None
        at += length


def request_payload(method: str, path: str, headers: Mapping[str, str], body: bytes) -> bytes:
    """A REQUEST's payload: its head as JSON (length-prefixed), then the body as sent."""
    head = json.dumps({"method": method, "path": path, "headers": dict(headers)}).encode()
    return struct.pack("!I", len(head)) + head + body


def parse_request(payload: bytes) -> tuple[str, str, dict[str, str], bytes]:
    """(method, path, headers, body) of a REQUEST's payload; MuxError if it is malformed."""
    if len(payload) < 4:
        raise MuxError("a request without its head")
    (length,) = struct.unpack_from("!I", payload)
    try:
        head = json.loads(payload[4 : 4 + length])
        method, path, headers = head["method"], head["path"], head["headers"]
    except (ValueError, KeyError, TypeError):
        raise MuxError("a request whose head is not {method, path, headers}") from None
    if not (isinstance(method, str) and isinstance(path, str) and _strings(headers)):
        raise MuxError("a request's method, path and headers must be strings")
    return method, path, headers, payload[4 + length :]


def start_payload(status: int, headers: Sequence[tuple[str, str]]) -> bytes:
    return json.dumps({"status": status, "headers": list(headers)}).encode()


def parse_start(payload: bytes) -> tuple[int, dict[str, str]]:
    """(status, headers with lower-case names) of a START's payload; MuxError if malformed."""
    try:
        head = json.loads(payload)
        status = int(head["status"])
        headers = {str(k).lower(): str(v) for k, v in head["headers"]}
    except (ValueError, KeyError, TypeError):
        raise MuxError("a start that is not {status, headers}") from None
    return status, headers


def _strings(headers: object) -> bool:
    return isinstance(headers, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    )
