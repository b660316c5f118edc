"""Redis URLs every component takes: a server (`redis://`, `rediss://`, `unix://`) or the
primary that Valkey Sentinel names (`redis+sentinel://`), so a failover is followed.

    redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]

The user and password are the component's ACL user on the data nodes (`bus/acl.py`); the
sentinels are asked without credentials. Clients: `interlude.bus.sentinel` (the tool bus) and
`interlude.gateway.ratelimit` (the rate limits).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

SCHEMES = ("redis://", "rediss://", "unix://", "redis+sentinel://")
SCHEME = "redis+sentinel"


@dataclass(frozen=True)
class SentinelURL:
    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None


def parse(url: str) -> SentinelURL:
    """A `redis+sentinel://` URL's parts; ValueError naming what is wrong."""
    parts = urlsplit(url)
    if parts.scheme != SCHEME:
        raise ValueError(f"a Sentinel URL starts with {SCHEME}://, got {url!r}")
    hosts = parts.netloc.rpartition("@")[2]
    sentinels = []
    for node in filter(None, hosts.split(",")):
        host, _, port = node.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"Sentinel URL {url!r}: {node!r} is not host:port")
        sentinels.append((host.strip("[]"), int(port)))
    path = [p for p in parts.path.split("/") if p]
    if not sentinels or not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError(
            f"Sentinel URL {url!r}: want {SCHEME}://[user:password@]host:port[,...]/service[/db]"
        )
    creds = parts.netloc.rpartition("@")[0]
    user, _, password = creds.partition(":")
    return SentinelURL(
        tuple(sentinels),
        unquote(path[0]),
        int(path[1]) if len(path) == 2 else 0,
        unquote(user) or None,
        unquote(password) or None,
    )
