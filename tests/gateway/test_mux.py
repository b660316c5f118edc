"""The gateway's link to an engine (`gateway/mux.py` to `engine/mux.py`), on a real uvicorn
server in a thread running a stand-in engine: FastAPI with the engine's own `mux_router`, and a
chat route that streams numbered frames (or holds, or fails, as the request asks).

What is checked: answers (streamed and JSON, with their status and headers) come back whole
over one link; a client that leaves cancels its exchange on the engine; a link that drops or a
stalled answer breaks off with the error frame; an engine that refuses the link is called over
plain HTTP; the next request after a drop connects again.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from interlude.api.wire import SSE_DONE, sse
from interlude.engine.mux import mux_router
from interlude.gateway import mux as gateway_mux
from interlude.gateway.mux import MuxUpstream
from interlude.gateway.upstream import relay

from .threaded import threaded_server

HEADERS = {"content-type": "application/json", "x-tenant": "t1"}


class Seen:
    """What the stand-in engine saw: each request's headers, streams that ended early."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []
        self.cut = 0  # streams closed before their last frame
        self.whole = 0


def stand_in(seen: Seen, link: bool = True, token: str = "") -> FastAPI:
    app = FastAPI()
    if link:
        app.include_router(mux_router(token))

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Response:
        body = await request.json()
        seen.headers.append(dict(request.headers))
        if body.get("fail"):
            raise RuntimeError("the stand-in fails as asked")
        if not body.get("stream"):
            return JSONResponse({"echo": body}, status_code=201, headers={"x-session-id": "s1"})

        async def frames() -> AsyncIterator[bytes]:
            finished = False
            try:
                for i in range(body.get("frames", 3)):
                    yield sse({"i": i})
                    await asyncio.sleep(0.01)
                await asyncio.sleep(body.get("hold", 0))
                yield SSE_DONE
                finished = True
            finally:
                if finished:
                    seen.whole += 1
                else:
                    seen.cut += 1

        return StreamingResponse(frames(), media_type="text/event-stream")

    return app


@contextmanager
def engine(
    free_port: Callable[[], int], seen: Seen, raised: list[BaseException] | None = None, **kw: Any
) -> Iterator[str]:
    """The stand-in on a real server; what its app raises to uvicorn goes into `raised` (uvicorn
    would log it as "Exception in ASGI application")."""
    inner = stand_in(seen, **kw)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        try:
            await inner(scope, receive, send)
        except BaseException as exc:
            if raised is not None:
                raised.append(exc)
            raise

    with threaded_server(app, free_port(), lifespan="off") as url:
        yield url


def ask(**body: Any) -> bytes:
    return json.dumps({"model": "tiny", **body}).encode()


async def read_all(upstream: MuxUpstream, url: str, body: bytes) -> tuple[int, bytes]:
    answer = await upstream.open(url, body, HEADERS)
    return answer.status_code, b"".join([c async for c in relay(answer)])


@asynccontextmanager
async def linked(read_timeout_s: float = 30.0, token: str = "") -> AsyncIterator[MuxUpstream]:
    """The gateway's upstream, closed (its links with it) however the test's client ends."""
    upstream = MuxUpstream(2.0, read_timeout_s, token)
    try:
        yield upstream
    finally:
        await upstream.close()


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run a test's client; a link that leaves an answer hanging fails it, not the session."""
    asyncio.run(asyncio.wait_for(main, 20))


async def until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the condition did not hold in time")


def test_answers_come_back_whole_over_one_link(free_port: Callable[[], int]) -> None:
    seen = Seen()

    async def main() -> None:
        async with linked() as upstream:
            got = await asyncio.gather(
                *(read_all(upstream, url, ask(stream=True, frames=5)) for _ in range(6))
            )
            expected = b"".join(sse({"i": i}) for i in range(5)) + SSE_DONE
            assert got == [(200, expected)] * 6
            answer = await upstream.open(url, ask(stream=False), HEADERS)
            assert (answer.status_code, answer.streamed) == (201, False)
            assert answer.headers["x-session-id"] == "s1"
            body = b"".join([c async for c in relay(answer)])
            assert json.loads(body) == {"echo": {"model": "tiny", "stream": False}}
            assert list(upstream.links) == [url]  # one link carried all seven

    with engine(free_port, seen) as url:
        run(main())
    assert seen.whole == 6 and seen.cut == 0
    assert all(h["x-tenant"] == "t1" for h in seen.headers)


def test_a_gateway_that_closes_its_link_leaves_the_engine_nothing_to_raise(
    free_port: Callable[[], int],
) -> None:
    """A gateway that shuts down closes its links; the engine's side of each then ends quietly,
    not with a traceback for every link on every gateway restart."""
    raised: list[BaseException] = []

    async def main() -> None:
        async with linked() as upstream:
            assert await read_all(upstream, url, ask(stream=True, frames=1)) == (
                200,
                sse({"i": 0}) + SSE_DONE,
            )
        await asyncio.sleep(0.3)  # the engine sees the close and ends the link's route

    with engine(free_port, Seen(), raised) as url:
        run(main())
    assert raised == []


def test_a_client_that_leaves_cancels_its_exchange(free_port: Callable[[], int]) -> None:
    seen = Seen()

    async def main() -> None:
        async with linked() as upstream:
            answer = await upstream.open(url, ask(stream=True, hold=30), HEADERS)
            body = relay(answer)
            assert await anext(body) == sse({"i": 0})
            await body.aclose()  # type: ignore[attr-defined]
            await until(lambda: seen.cut == 1)
            assert not upstream.links[url].answers

    with engine(free_port, seen) as url:
        run(main())


def test_a_link_that_drops_breaks_its_answers_and_the_next_request_connects_again(
    free_port: Callable[[], int],
) -> None:
    seen = Seen()

    async def main() -> None:
        async with linked() as upstream:
            answer = await upstream.open(url, ask(stream=True, frames=1, hold=30), HEADERS)
            body = relay(answer)
            assert await anext(body) == sse({"i": 0})
            first = upstream.links[url]
            await first.ws.close()  # the link drops under the answer
            rest = b"".join([c async for c in body])
            assert b"broke off" in rest and rest.endswith(SSE_DONE)
            await until(lambda: seen.cut == 1)  # the engine took the drop as a disconnect
            assert await read_all(upstream, url, ask(stream=True, frames=1)) == (
                200,
                sse({"i": 0}) + SSE_DONE,
            )
            assert upstream.links[url] is not first

    with engine(free_port, seen) as url:
        run(main())


def test_an_answer_that_stalls_past_the_read_timeout_breaks_off(
    free_port: Callable[[], int],
) -> None:
    seen = Seen()

    async def main() -> None:
        async with linked(0.4) as upstream:
            status, body = await read_all(upstream, url, ask(stream=True, frames=1, hold=30))
            assert status == 200 and b"broke off" in body and body.endswith(SSE_DONE)

    with engine(free_port, seen) as url:
        run(main())


def test_an_app_that_fails_answers_500(free_port: Callable[[], int]) -> None:
    async def main() -> None:
        async with linked() as upstream:
            status, _ = await read_all(upstream, url, ask(fail=True))
            assert status == 500
            assert url in upstream.links  # over the link, which stays up
            assert await read_all(upstream, url, ask(stream=False)) == (
                201,
                b'{"echo":{"model":"tiny","stream":false}}',
            )

    with engine(free_port, Seen()) as url:
        run(main())


def test_an_engine_without_the_link_or_refusing_it_is_called_over_http(
    free_port: Callable[[], int],
) -> None:
    async def main(url: str, token: str) -> None:
        async with linked(token=token) as upstream:
            for _ in range(2):
                status, body = await read_all(upstream, url, ask(stream=True, frames=2))
                assert (status, body) == (200, sse({"i": 0}) + sse({"i": 1}) + SSE_DONE)
            assert not upstream.links and url in upstream._http_until

    with engine(free_port, Seen(), link=False) as url:
        run(main(url, ""))
    with engine(free_port, Seen(), token="secret") as url:  # the gateway's token is wrong
        run(main(url, "not-the-secret"))


def test_an_answer_its_client_does_not_read_is_given_up(
    free_port: Callable[[], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One stream must not hold the link's memory: past the bound, its answer breaks off and
    its exchange is cancelled on the engine."""
    monkeypatch.setattr(gateway_mux, "MAX_BUFFERED_BYTES", 64)
    seen = Seen()

    async def main() -> None:
        async with linked() as upstream:
            answer = await upstream.open(url, ask(stream=True, frames=20, hold=30), HEADERS)
            await until(lambda: seen.cut == 1)  # nobody read: cancelled past 64 bytes
            body = b"".join([c async for c in relay(answer)])
            assert b"read nothing" not in body and body.endswith(SSE_DONE)  # error frame, DONE
            assert b"broke off" in body

    with engine(free_port, seen) as url:
        run(main())
