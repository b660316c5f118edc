"""A key-guessing flood for `bench gateway --flood`, in a process of its own: chat completions
with a real key id and a wrong secret, Poisson arrivals at a rate, from many loopback addresses
in turn (the gateway limits failed attempts per address; one address alone would only measure
its cheap 429).

Raw asyncio streams and one request built once: the flood itself costs little CPU, so what it
changes in the measured arms is the gateway's work answering it. (Sent from the measuring
client with an HTTP client library, on 2 cores, it took most of a core and slowed the client's
own requests, the direct arm's too, by seconds.) Prints `{"status": count}` (0: no answer) as
JSON when done.

    python -m interlude.bench.flood http://127.0.0.1:8000 KEYID --rate 200 --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from urllib.parse import urlsplit

ADDRESSES = 250  # 127.0.1.1 to 127.0.1.250


def request_bytes(host: str, key_id: str, model: str) -> bytes:
    """One wrong-secret chat completion for `key_id`, closing its connection after."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hi"}]})
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
        f"authorization: Bearer il-{key_id}-{'x' * 32}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return (head + body).encode()


async def _one(host: str, port: int, source: str, request: bytes) -> int:
    """The status code of one request sent from `source` (0: no answer)."""
    try:
        reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
    except OSError:
        return 0
    try:
        writer.write(request)
        status = await reader.readline()  # b"HTTP/1.1 401 Unauthorized\r\n"
        await reader.read()  # the rest, until the server closes
        parts = status.split()
        return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    except OSError:
        return 0
    finally:
        writer.close()


def poisson_offsets(rng: random.Random, rate: float, duration_s: float) -> list[float]:
    """Arrival offsets (seconds) of a Poisson process at `rate` over `duration_s`."""
    out, at = [], 0.0
    while at < duration_s:
        out.append(at)
        at += rng.expovariate(rate)
    return out


async def launch_at(offsets: list[float], start: float, launch: Callable[[int], None]) -> None:
    """Call `launch(i)` at `start + offsets[i]` (perf_counter seconds) for each i."""
    for i, offset in enumerate(offsets):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        launch(i)


async def flood(
    url: str, key_id: str, rate: float, duration_s: float, model: str = "tiny", seed: int = 0
) -> Counter[int]:
    """Send the flood for `duration_s`; the answers' status codes, counted."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    request = request_bytes(f"{host}:{port}", key_id, model)
    tasks: list[asyncio.Task[int]] = []

    def send(i: int) -> None:
        source = f"127.0.1.{i % ADDRESSES + 1}"
        tasks.append(asyncio.create_task(_one(host, port, source, request)))

    offsets = poisson_offsets(random.Random(seed), rate, duration_s)
    await launch_at(offsets, time.perf_counter(), send)
    return Counter(await asyncio.gather(*tasks))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url")
    ap.add_argument("key_id")
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--duration", type=float, required=True)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    answers = asyncio.run(flood(a.url, a.key_id, a.rate, a.duration, a.model, a.seed))
    print(json.dumps({str(k): v for k, v in sorted(answers.items())}))


if __name__ == "__main__":
    main()
