"""The floor under the tool bus's round trip: two Redis stream hops between two processes.

`python -m interlude.bench.stream_echo URL` echoes every entry of the stream `PING` to the
stream `PONG`, with blocking reads, on the event loop the workers use. `floor` times XADD to
PING until the echo is read back from PONG: the least any engine → worker → engine round trip
over Redis Streams can take on this machine with this client, before any tool-bus logic.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

from redis.asyncio import Redis

from interlude import aio
from interlude.bus.streams import stream_entries

PING, PONG = "interlude:bench:ping", "interlude:bench:pong"


async def echo(url: str) -> None:
    reader = Redis.from_url(url, decode_responses=True)
    writer = Redis.from_url(url, decode_responses=True)
    last = "0-0"
    while True:
        for entry_id, fields in stream_entries(await reader.xread({PING: last}, block=0)):
            last = entry_id
            await writer.xadd(PONG, dict(fields or {"i": "?"}))


async def floor(url: str, rounds: int = 300, gap_s: float = 0.005) -> dict[str, float]:
    """p50/p99 (ms) of `rounds` ping-pongs through a running `echo`, `gap_s` apart."""
    reader = Redis.from_url(url, decode_responses=True)
    writer = Redis.from_url(url, decode_responses=True)
    last, took = "0-0", []
    try:
        for i in range(rounds):
            started = time.perf_counter()
            await writer.xadd(PING, {"i": str(i)})
            reply = stream_entries(await reader.xread({PONG: last}, block=5000, count=1))
            if not reply:
                raise TimeoutError("the stream echo did not answer in 5 s")
            last = reply[-1][0]
            took.append((time.perf_counter() - started) * 1000)
            await asyncio.sleep(gap_s)
    finally:
        await reader.aclose()
        await writer.aclose()
    quantiles = statistics.quantiles(took, n=100)
    return {"p50_ms": statistics.median(took), "p99_ms": quantiles[98], "rounds": rounds}


if __name__ == "__main__":
    aio.run(echo(sys.argv[1]))
