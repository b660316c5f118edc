"""The multiplexed link's frames: what one end writes, the other reads back; anything cut short
or unknown is a MuxError, never a misread."""

from __future__ import annotations

import pytest

from interlude.api import mux


def test_frames_in_a_message_read_back_in_order() -> None:
    body = b"x" * (mux.MAX_DATA + 5)
    message = b"".join(
        [
            mux.frame(7, mux.Kind.START, mux.start_payload(200, [("Content-Type", "a/b")])),
            *mux.data_frames(7, body),
            mux.frame(9, mux.Kind.CANCEL),
            mux.frame(7, mux.Kind.END),
        ]
    )
    got = list(mux.frames(message))
    assert [(s, k) for s, k, _ in got] == [
        (7, mux.Kind.START),
        (7, mux.Kind.DATA),
        (7, mux.Kind.DATA),
        (9, mux.Kind.CANCEL),
        (7, mux.Kind.END),
    ]
    assert got[1][2] + got[2][2] == body and len(got[1][2]) == mux.MAX_DATA
    assert mux.parse_start(got[0][2]) == (200, {"content-type": "a/b"})


def test_a_request_carries_its_head_and_its_body_as_sent() -> None:
    body = b'{"model": "tiny"}\x00\xff'
    payload = mux.request_payload("POST", "/v1/chat/completions", {"x-a": "1"}, body)
    assert mux.parse_request(payload) == ("POST", "/v1/chat/completions", {"x-a": "1"}, body)


@pytest.mark.parametrize(
    "message",
    [
        mux.frame(1, mux.Kind.DATA, b"abc")[:-1],  # payload cut short
        mux.frame(1, mux.Kind.END)[:5],  # header cut short
        mux.HEADER.pack(1, 99, 0),  # unknown kind
    ],
)
def test_a_broken_message_is_a_mux_error(message: bytes) -> None:
    with pytest.raises(mux.MuxError):
        list(mux.frames(message))


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\x00\x00\x00\x02{}",
        b"\x00\x00\x00\x04nope",
        mux.request_payload("POST", "/", {}, b"")[:6],
    ],
)
def test_a_malformed_request_is_a_mux_error(payload: bytes) -> None:
    with pytest.raises(mux.MuxError):
        mux.parse_request(payload)


def test_a_request_whose_headers_are_not_strings_is_a_mux_error() -> None:
    head = b'{"method": "POST", "path": "/", "headers": {"a": 1}}'
    with pytest.raises(mux.MuxError, match="strings"):
        mux.parse_request(len(head).to_bytes(4, "big") + head)


@pytest.mark.parametrize("payload", [b"{}", b"not json", b'{"status": "x", "headers": []}'])
def test_a_malformed_start_is_a_mux_error(payload: bytes) -> None:
    with pytest.raises(mux.MuxError):
        mux.parse_start(payload)
