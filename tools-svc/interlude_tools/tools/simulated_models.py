"""Simulated image and TTS model endpoints, with the latencies InferCept measured.

One machine has no diffusion model or TTS server, but a benchmark still needs calls that take
as long as theirs do: the engine's pause-and-resume policies are judged on how they spend those
seconds. This server answers `/v1/image` and `/v1/tts` (the contract of `model_endpoints`) after
a delay drawn from the paper's interception times (DESIGN section 4: Image mean 20.03 s, spread
7.8 s; TTS 17.24 s, 7.6 s; the numbers the workload generator uses, `interlude_workloads.generate`),
times `time_scale` so tests can run at 0.001x.

Run it alone with `python -m interlude_tools.tools.simulated_models --port 8500`, or in-process with
`start_simulated_models()` (a thread of its own: one-machine mode and tests).
"""

from __future__ import annotations

import asyncio
import math
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import typer
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from interlude_workloads.generate import PROFILES


@dataclass(frozen=True)
class Latency:
    """A latency distribution given by its mean and variance (seconds, seconds squared).

    Drawn from the gamma distribution with those two moments: shape k = mean²/var, scale
    θ = var/mean. Why gamma: a latency is positive and right-skewed, and the gamma's two
    parameters follow from the two moments the paper gives in closed form (a lognormal would
    too; with k ≈ 50 here both are close to a normal, and the gamma never needs clipping at 0
    as a normal would). Only the first two moments are the paper's; the shape beyond them is
    our assumption.

    The table's spread is read as a standard deviation, as the workload generator reads it
    (its docstring says why: as a variance, the calculator's would be 85x its mean). The shared
    trace agrees: its chat-derived calls (chat, image and TTS mixed) have a standard deviation
    of 16.8 s, which a mixture of these three with variances 15.6, 7.8 and 7.6 s² (about 6 s)
    cannot reach, and one with those standard deviations comes closer to (about 12 s).
    """

    mean: float
    var: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mean) and math.isfinite(self.var)):
            raise ValueError("mean and var must be finite")
        if self.mean <= 0 or self.var <= 0:
            raise ValueError(f"mean and var must be > 0, got {self.mean}, {self.var}")

    @property
    def shape(self) -> float:
        return self.mean**2 / self.var

    @property
    def scale(self) -> float:
        return self.var / self.mean

    def sample(self, rng: random.Random) -> float:
        return rng.gammavariate(self.shape, self.scale)


IMAGE = Latency(PROFILES["image"].duration_mean_s, PROFILES["image"].duration_std_s ** 2)
TTS = Latency(PROFILES["tts"].duration_mean_s, PROFILES["tts"].duration_std_s ** 2)
WORDS_PER_SECOND = 2.5  # speech at 150 words a minute: how long the made-up audio is


@dataclass
class SimulatedModels:
    """The simulated endpoints' state: one seeded RNG for latencies and ids (reproducible).

    `time_scale` multiplies every sleep (0 answers at once); answers report the unscaled latency
    drawn (`latency_s`), so a test at 0.001x still sees the paper's numbers.
    """

    seed: int = 0
    time_scale: float = 1.0
    image: Latency = IMAGE
    tts: Latency = TTS
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        if not math.isfinite(self.time_scale) or self.time_scale < 0:
            raise ValueError(f"time_scale must be >= 0, got {self.time_scale}")
        self.rng = random.Random(self.seed)

    def draw(self, kind: str) -> float:
        """One latency (unscaled seconds) for "image" or "tts"."""
        return (self.image if kind == "image" else self.tts).sample(self.rng)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/image", self._image, methods=["POST"]),
                Route("/v1/tts", self._tts, methods=["POST"]),
                Route("/health", self._health, methods=["GET"]),
            ]
        )

    async def _image(self, request: Request) -> JSONResponse:
        prompt = await _string_argument(request, "prompt")
        if isinstance(prompt, JSONResponse):
            return prompt
        latency = await self._wait("image")
        ident = f"img-{self.rng.getrandbits(48):012x}"
        url = f"simulated://image/{ident}.png"
        return JSONResponse(
            {"id": ident, "width": 512, "height": 512, "url": url, "latency_s": latency}
        )

    async def _tts(self, request: Request) -> JSONResponse:
        text = await _string_argument(request, "text")
        if isinstance(text, JSONResponse):
            return text
        latency = await self._wait("tts")
        ident = f"tts-{self.rng.getrandbits(48):012x}"
        seconds = round(max(0.5, len(text.split()) / WORDS_PER_SECOND), 2)
        url = f"simulated://audio/{ident}.wav"
        return JSONResponse({"id": ident, "duration_s": seconds, "url": url, "latency_s": latency})

    async def _health(self, request: Request) -> JSONResponse:
        return JSONResponse({"ok": True, "time_scale": self.time_scale})

    async def _wait(self, kind: str) -> float:
        latency = self.draw(kind)
        await asyncio.sleep(latency * self.time_scale)
        return latency


async def _string_argument(request: Request, key: str) -> str | JSONResponse:
    """The body's non-empty string `key`, or the 400 answer saying what is wrong."""
    try:
        body: Any = await request.json()
    except ValueError:
        return JSONResponse({"error": "the body must be JSON"}, status_code=400)
    value = body.get(key) if isinstance(body, dict) else None
    if not isinstance(value, str) or not value:
        return JSONResponse({"error": f"{key!r} must be a non-empty string"}, status_code=400)
    return value


class ServerThread:
    """An ASGI app served by uvicorn on a thread and event loop of its own.

    Why a thread: tests and one-machine mode need a real HTTP server without a process to
    manage, and its own loop keeps the app's sleeps off the caller's. Port 0 picks a free port
    (`url` says which). Side effects: listens on `host` until `stop`.
    """

    def __init__(self, app: ASGIApp, host: str = "127.0.0.1", port: int = 0) -> None:
        self._socket = socket.create_server((host, port))
        bound = self._socket.getsockname()
        self.url = f"http://{host}:{bound[1]}"
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, timeout_graceful_shutdown=1
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )

    def start(self, timeout_s: float = 5.0) -> ServerThread:
        """Serve; returns once the server accepts connections (RuntimeError if it does not)."""
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server on {self.url} did not start")
            time.sleep(0.005)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving and wait for the thread (open requests get about a second)."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._socket.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_simulated_models(
    seed: int = 0, time_scale: float = 1.0, host: str = "127.0.0.1", port: int = 0
) -> ServerThread:
    """The simulated endpoints, started on a thread: stop it with `.stop()`."""
    return ServerThread(SimulatedModels(seed, time_scale).app(), host, port).start()


cli = typer.Typer(add_completion=False, help=__doc__)


@cli.command()
def main(
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8500, min=0, max=65535),
    seed: int = typer.Option(0, help="seed of the latency and id draws"),
    time_scale: float = typer.Option(1.0, min=0.0, help="multiply every latency by this"),
) -> None:
    """Serve /v1/image and /v1/tts with the paper's latencies until Ctrl-C."""
    uvicorn.run(SimulatedModels(seed, time_scale).app(), host=host, port=port, log_level="info")


if __name__ == "__main__":
    cli()
