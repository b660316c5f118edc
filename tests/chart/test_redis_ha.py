"""The chart's Valkey HA mode (redis.ha): what it renders, and its ACL and Sentinel config on
real servers.

No cluster runs here, so the pods' start scripts are not run; what they assemble is. A real
primary loads the rendered ACL file, a real replica syncs from it as the `replication` user
with the Secret's password, and two real sentinels load the rendered sentinel.conf with its
placeholders filled in as the start script fills them: they watch the set as the `sentinel`
user, find each other, refuse a password-less client anything but where the primary is, and
fail over when the primary is SIGKILLed, which an engine's bus client (its own ACL user,
through a redis+sentinel:// URL) follows.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis
from redis.exceptions import NoPermissionError

from interlude.bus import acl
from interlude.bus.streams import connect
from interlude.stack.valkey import binary, free_port, wait_ping

from .conftest import CASES, Manifest, by_kind, container, env_of, name

HA = CASES["redis-ha"]  # replicas and sentinels, behind network policies
# Fast enough for a test: a node is down after 1 s of silence.
FAST = ("--set", "redis.ha.enabled=true,redis.ha.downAfterMilliseconds=1000")
SET = "interlude"


def _secret(docs: tuple[Manifest, ...]) -> dict[str, str]:
    data = by_kind(docs, "Secret")[name("redis")]["data"]
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def _pod(docs: tuple[Manifest, ...]) -> dict[str, Any]:
    spec: dict[str, Any] = by_kind(docs, "StatefulSet")[name("redis")]["spec"]
    return spec


def test_ha_renders_replicas_sentinels_a_budget_and_sentinel_urls(render: Any) -> None:
    docs = render(*HA)
    spec = _pod(docs)
    assert spec["replicas"] == 3 and spec["podManagementPolicy"] == "Parallel"
    pod = spec["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["valkey", "sentinel"]
    assert pod["affinity"]["podAntiAffinity"]  # spread over nodes where possible
    service = by_kind(docs, "Service")[name("redis")]["spec"]
    assert service["publishNotReadyAddresses"] is True
    assert {p["port"] for p in service["ports"]} == {6379, 26379}
    pdb = by_kind(docs, "PodDisruptionBudget")[name("redis")]["spec"]
    assert pdb["maxUnavailable"] == 1
    nodes = ",".join(f"{name('redis')}-{i}.{name('redis')}:26379" for i in range(3))
    for component in ("engine", "gateway", "tools"):
        url = env_of(container(docs, component))["INTERLUDE_REDIS_URL"]
        assert url == (f"redis+sentinel://{component}:$(INTERLUDE_REDIS_PASSWORD)@{nodes}/{SET}/0")
    # The tool pods may reach the sentinels; the set's pods each other.
    policies = by_kind(docs, "NetworkPolicy")
    tools_egress = policies[name("tools")]["spec"]["egress"]
    assert any({p["port"] for p in rule["ports"]} == {6379, 26379} for rule in tools_egress)
    ingress = policies[name("redis")]["spec"]["ingress"]
    assert any(
        peer.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component")
        == "redis"
        for rule in ingress
        for peer in rule["from"]
    )


def test_one_valkey_has_no_ha_users_no_sentinel_and_no_budget(render: Any) -> None:
    docs = render()
    secret = _secret(docs)
    assert "replication-password" not in secret and "sentinel-password" not in secret
    assert "user replication" not in secret["users.acl"]
    assert name("redis") not in by_kind(docs, "PodDisruptionBudget")
    assert [c["name"] for c in _pod(docs)["template"]["spec"]["containers"]] == ["valkey"]
    url = env_of(container(docs, "engine"))["INTERLUDE_REDIS_URL"]
    assert url.startswith("redis://engine:")


def test_the_ha_acl_file_is_the_rules_with_every_users_password(render: Any) -> None:
    secret = _secret(render(*HA))
    passwords = {
        u: secret["password" if u == acl.ADMIN else f"{u}-password"] for u in acl.users(ha=True)
    }
    assert secret["users.acl"] == acl.acl_file(passwords, ha=True)


def test_a_quorum_larger_than_the_set_is_refused(helm: str) -> None:
    from .conftest import CHART, run_helm

    out = run_helm(
        helm, "template", "t", str(CHART), "--set",
        "redis.ha.enabled=true,redis.ha.replicas=3,redis.ha.quorum=4",
    )  # fmt: skip
    assert out.returncode != 0 and "must not exceed redis.ha.replicas" in out.stderr


class _RenderedSet:
    """A primary, a replica and two sentinels from the chart's rendered files, on this host."""

    def __init__(self, docs: tuple[Manifest, ...], root: Path) -> None:
        self.root = root
        self.secret = _secret(docs)
        self.sentinel_conf = by_kind(docs, "ConfigMap")[name("redis")]["data"]["sentinel.conf"]
        (root / "users.acl").write_text(self.secret["users.acl"])
        self.primary_port, self.replica_port = free_port(), free_port()
        self.sentinel_ports = [free_port(), free_port()]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def _valkey(self, role: str, port: int, *extra: str) -> None:
        data = self.root / role
        data.mkdir()
        argv = [str(binary()), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data)]
        argv += ["--aclfile", str(self.root / "users.acl"), "--appendonly", "yes", *extra]
        self.procs[role] = _quiet(argv)

    def _sentinel(self, k: int) -> None:
        password = self.secret["sentinel-password"]
        port = self.sentinel_ports[k]
        # As interlude.redis.sentinelStart fills the placeholders (addresses for names here).
        conf = (
            self.sentinel_conf.replace("@PRIMARY@ 6379", f"127.0.0.1 {self.primary_port}")
            .replace("@ANNOUNCE@", "127.0.0.1")
            .replace("@SENTINEL_HASH@", hashlib.sha256(password.encode()).hexdigest())
            .replace("@SENTINEL_PASSWORD@", password)
            .replace("port 26379", f"port {port}")
            .replace("dir /run/sentinel", f"dir {self.root}")
        )
        path = self.root / f"sentinel-{k}.conf"
        path.write_text(conf)
        self.procs[f"sentinel-{k}"] = _quiet([str(binary()), str(path), "--sentinel"])
        wait_ping(f"redis://127.0.0.1:{port}", 10)

    def start(self) -> None:
        self._valkey("primary", self.primary_port)
        wait_ping(self.admin_url(self.primary_port), 10)
        repl = self.secret["replication-password"]
        self._valkey(
            "replica", self.replica_port, "--masteruser", "replication", "--masterauth", repl,
            "--replicaof", "127.0.0.1", str(self.primary_port),
        )  # fmt: skip
        wait_ping(self.admin_url(self.replica_port), 10)
        _until(lambda: self.admin(self.replica_port).info("replication")["master_link_status"]
               == "up", "the replica never synced as the replication user")  # fmt: skip
        for k in range(2):
            self._sentinel(k)
        # Each sentinel finds the other (through the primary's hello channel, as `sentinel`).
        _until(lambda: all(self.sentinel(p).sentinel_sentinels(SET) for p in self.sentinel_ports),
               "the sentinels never found each other")  # fmt: skip

    def stop(self) -> None:
        for p in self.procs.values():
            p.kill()
            p.wait()

    def admin_url(self, port: int) -> str:
        return f"redis://default:{self.secret['password']}@127.0.0.1:{port}/0"

    def admin(self, port: int) -> Redis:
        return Redis.from_url(self.admin_url(port), decode_responses=True)

    def sentinel(self, port: int, user: str | None = None) -> Redis:
        password = self.secret["sentinel-password"] if user else None
        return Redis(port=port, username=user, password=password, decode_responses=True)

    def url(self, user: str) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{user}:{self.secret[f'{user}-password']}@{hosts}/{SET}/0"


def _quiet(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
    )


def _until(ok: Any, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.fixture
def rendered_set(render: Any, tmp_path: Path) -> Iterator[_RenderedSet]:
    s = _RenderedSet(render(*FAST), tmp_path)
    try:
        s.start()
        yield s
    finally:
        s.stop()


def test_a_client_without_a_password_may_only_ask_where_the_primary_is(
    rendered_set: _RenderedSet,
) -> None:
    port = rendered_set.sentinel_ports[0]
    anyone = rendered_set.sentinel(port)
    host, primary = anyone.sentinel_get_master_addr_by_name(SET)
    assert (host, int(primary)) == ("127.0.0.1", rendered_set.primary_port)
    assert SET in anyone.sentinel_masters()
    for command in (("SENTINEL", "FAILOVER", SET), ("SENTINEL", "REMOVE", SET),
                    ("SENTINEL", "SET", SET, "quorum", "1"), ("ACL", "LIST")):  # fmt: skip
        with pytest.raises(NoPermissionError):
            anyone.execute_command(*command)
    # Its own `sentinel` user may (what an operator uses): the rules refuse, not the server.
    assert rendered_set.sentinel(port, "sentinel").execute_command("ACL", "WHOAMI") == "sentinel"


def test_a_failover_by_the_rendered_sentinels_is_followed_by_an_engine(
    rendered_set: _RenderedSet,
) -> None:
    async def body() -> None:
        redis = connect(rendered_set.url("engine"), max_connections=2)
        try:
            # An engine's own command on its own key (it may not XADD a result stream).
            await redis.xadd("interlude:tool-calls", {"n": "1"})
            replica = rendered_set.admin(rendered_set.replica_port)
            _until(lambda: replica.xlen("interlude:tool-calls") == 1, "never replicated")
            rendered_set.procs["primary"].send_signal(signal.SIGKILL)
            deadline = time.monotonic() + 30
            while True:
                try:
                    await redis.xadd("interlude:tool-calls", {"n": "2"})
                    break
                except NoPermissionError:
                    raise
                except Exception:  # refused or cut until the failover is done
                    assert time.monotonic() < deadline, "no failover within 30 s"
                    await asyncio.sleep(0.2)
        finally:
            await redis.aclose()

    asyncio.run(body())
    promoted = rendered_set.admin(rendered_set.replica_port)
    assert [e[1]["n"] for e in promoted.xrange("interlude:tool-calls")] == ["1", "2"]
    assert promoted.role()[0] == "master"
    # The sentinels reconfigured it as `sentinel`, the replica synced as `replication`: nothing
    # any of them (or the engine) sent was refused by the rules.
    assert promoted.acl_log() == []
