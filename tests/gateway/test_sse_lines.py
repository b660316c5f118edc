"""`interlude.api.wire.sse_lines`: an SSE body split only at CRLF, LF and CR, however the bytes
arrive."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from itertools import pairwise

import pytest

from interlude.api.wire import sse_data, sse_lines

FRAME = 'data: {"t":"a\u2028b\x85c\u00e9"}'
BODY = (FRAME + "\r\n\r\ndata: x\rdata: y\n\ndata: [DONE]\n\nlast").encode()
LINES = [FRAME, "", "data: x", "data: y", "", "data: [DONE]", "", "last"]


async def _chunks(body: bytes, cuts: list[int]) -> AsyncIterator[bytes]:
    edges = [0, *cuts, len(body)]
    for a, b in pairwise(edges):
        yield body[a:b]


async def _collect(it: AsyncIterator[str]) -> list[str]:
    return [x async for x in it]


@pytest.mark.parametrize("cut", range(1, len(BODY)))
def test_every_split_point_gives_the_same_lines(cut: int) -> None:
    # Cuts inside a CRLF, inside a multibyte character, and everywhere else.
    assert asyncio.run(_collect(sse_lines(_chunks(BODY, [cut])))) == LINES


def test_one_byte_at_a_time_and_data_up_to_done() -> None:
    one = list(range(1, len(BODY)))
    assert asyncio.run(_collect(sse_lines(_chunks(BODY, one)))) == LINES
    data = asyncio.run(_collect(sse_data(_chunks(BODY, one))))
    assert data == ['{"t":"a\u2028b\x85c\u00e9"}', "x", "y"]
