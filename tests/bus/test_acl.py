"""The per-component Valkey users (`interlude.bus.acl`) on a real server loading `acl_file()`.

The real code runs as each user: the engine's `ServerTools`, a `Worker` with the textworld
tool, the worker's publish and bus gauges, the gateway's `RateLimiter`; the server's ACL LOG
then shows that none of their commands was refused (a refusal redis-py swallows, or a retried
heartbeat, would otherwise pass unseen). And what a user must not do is refused: each probe is
also run by a user with every right (`~* &* +@all`), so it is the rules that refuse it.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import NoPermissionError, ResponseError

from interlude.api.bus import CALL_STREAM, DEAD_LETTER_STREAM, TOOL_GROUP, ToolCall
from interlude.bus import EngineBus, acl
from interlude.bus.published import publish
from interlude.bus.streams import connect
from interlude.engine.tools import ServerTools
from interlude.gateway.ratelimit import RateLimiter
from interlude.stack.valkey import Valkey
from interlude_tools import observe
from interlude_tools.context import ToolEnv
from interlude_tools.registry import default_registry
from interlude_tools.tools.textworld import KEY_PREFIX, TextWorld
from interlude_tools.worker import Worker

from .conftest import build_call

PASSWORDS = {user: secrets.token_hex(16) for user in acl.users()}
CALLS, RESULTS = CALL_STREAM, "interlude:tool-results:eng"
LIMITS = "interlude:rl:{x}:0"  # a gateway's count for key "x" in one window


class AclValkey(Valkey):
    """The embedded Valkey loading an ACL file; `url` is the admin's (`start` pings with it)."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir)
        self.aclfile = data_dir / "users.acl"
        self.aclfile.write_text(acl.acl_file(PASSWORDS))

    def argv(self) -> list[str]:
        return [*super().argv(), "--aclfile", str(self.aclfile)]

    def user_url(self, user: str, password: str | None = None) -> str:
        return f"redis://{user}:{password or PASSWORDS[user]}@127.0.0.1:{self.port}/0"

    @property
    def url(self) -> str:
        return self.user_url(acl.ADMIN)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclValkey]:
    valkey = AclValkey(tmp_path_factory.mktemp("valkey-acl"))
    valkey.start()
    try:
        yield valkey
    finally:
        valkey.stop()


@pytest.fixture
def admin(server: AclValkey) -> Iterator[Redis]:
    """The admin's client, on an emptied server with an empty ACL LOG."""
    client = Redis.from_url(server.url, decode_responses=True)
    client.flushall()
    client.acl_log_reset()
    yield client
    client.close()


def test_the_key_prefixes_are_their_owners() -> None:
    from interlude.gateway import quota

    assert acl.TEXTWORLD_PREFIX == KEY_PREFIX
    assert acl.RATE_LIMIT_PREFIX == quota.KEY_PREFIX


def test_the_acl_file_needs_every_users_password() -> None:
    with pytest.raises(ValueError, match="engine"):
        acl.acl_file({u: "x" for u in acl.users() if u != "engine"})


def test_the_cli_writes_the_file_for_a_secret_you_make(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for user, password in PASSWORDS.items():
        monkeypatch.setenv(f"INTERLUDE_REDIS_PASSWORD_{user.upper()}", password)
    assert acl.main(["--from-env"]) == 0
    assert capsys.readouterr().out == acl.acl_file(PASSWORDS)
    monkeypatch.delenv("INTERLUDE_REDIS_PASSWORD_TOOLS")
    assert acl.main(["--from-env"]) == 2 and "tools" in capsys.readouterr().err


def _worker(server: AclValkey, **options: Any) -> tuple[Worker, TextWorld]:
    tools_url = server.user_url("tools")
    registry = default_registry(test_tools=True)
    textworld = TextWorld(ToolEnv(tools_url))
    registry.register(textworld)
    options = {"block_ms": 50, "claim_idle_ms": 300, **options}
    return Worker(connect(tools_url), "w1", registry, **options), textworld


def test_a_round_trip_with_each_component_as_its_own_user(server: AclValkey, admin: Redis) -> None:
    async def scenario() -> tuple[list[Any], frozenset[str], tuple[int, int], Worker]:
        engine = ServerTools(EngineBus(connect(server.user_url("engine")), "eng"), poll_ms=50)
        worker, textworld = _worker(server)
        running = asyncio.create_task(worker.run())
        try:
            await engine.start()
            await publish(worker.redis, worker.registry.specs(), "w1")
            calls = [
                build_call("c1", "calculator", {"expression": "6*7"}),
                build_call("s1", "sleep", {"delay_s": 0.4, "tokens": 2}),  # heartbeats meanwhile
                build_call("t1", "textworld", {"command": "look"}),
            ]
            results = await asyncio.gather(*(engine.call(c) for c in calls))
            # A call run again (reclaimed) gets its stored answer: WATCH, GET, then UNWATCH.
            again = await textworld.store.step("s-t1", "t1", "look", None)
            assert again == results[2].content
            names = await engine.published.names()
            return results, names, await observe.read_bus(worker.redis), worker
        finally:
            worker.stop()
            await asyncio.wait_for(running, 5)
            await engine.close()
            await textworld.aclose()
            await worker.redis.aclose()

    results, names, bus, worker = asyncio.run(scenario())
    assert [r.ok for r in results] == [True] * 3, [r.error for r in results]
    assert results[0].content == "42" and results[1].content == " x x"
    assert {"calculator", "textworld"} <= names and bus == (0, 0)
    assert worker.heartbeat.beats >= 1 and worker.posted == 3
    assert admin.keys(f"{KEY_PREFIX}*") == [f"{KEY_PREFIX}s-t1"]
    assert admin.acl_log() == []  # nothing was refused, not even a swallowed CLIENT SETINFO


def test_reclaims_and_dead_letters_run_as_the_tools_user(server: AclValkey, admin: Redis) -> None:
    """A crashed worker's calls: one is reclaimed and run (the done check), one was delivered
    too often and one cannot be decoded; both are dead-lettered (the script's "" keys)."""

    async def scenario() -> tuple[list[Any], Worker]:
        bus = EngineBus(connect(server.user_url("engine")), "eng")
        await bus.start()
        for call_id in ("r1", "p1"):  # r1 is run again, p1 the poison call
            await bus.submit(build_call(call_id, "calculator", {"expression": "1+1"}))
        admin.xadd(CALLS, {"v": "0", "body": "not a call"})
        admin.xgroup_create(CALLS, TOOL_GROUP, id="0")
        crashed = admin.xreadgroup(TOOL_GROUP, "crashed", {CALLS: ">"})[0][1]
        for _ in range(3):  # the poison call and the undecodable one: delivered 4 times
            admin.xclaim(CALLS, TOOL_GROUP, "crashed", 0, [e[0] for e in crashed[1:]])
        worker, textworld = _worker(server, claim_idle_ms=150, max_deliveries=3)
        running = asyncio.create_task(worker.run())
        try:
            got: list[Any] = []
            async with asyncio.timeout(5):
                while len(got) < 2:
                    got += await bus.fetch(block_ms=50)
            return sorted((d.result.call_id, d.result.error[:10]) for d in got), worker
        finally:
            worker.stop()
            await asyncio.wait_for(running, 5)
            await textworld.aclose()
            await worker.redis.aclose()
            await bus.close()

    results, worker = asyncio.run(scenario())  # stopped: its counts are final
    assert results == [("p1", "tool_error"), ("r1", "")]
    assert (worker.posted, worker.dead_lettered) == (1, 2)
    assert admin.xlen(DEAD_LETTER_STREAM) == 2 and admin.xlen(CALLS) == 0
    assert admin.acl_log() == []


def test_the_gateway_rate_limits_as_its_own_user(server: AclValkey, admin: Redis) -> None:
    async def scenario() -> list[bool]:
        # What is checked is the ACL, not the storage's speed: the first check connects and
        # loads the script, and on a loaded CI machine that once took over the 0.5 s a
        # serving gateway allows (StoreAway: TimeoutError). One window for the whole test.
        limiter = RateLimiter("2/minute", server.user_url("gateway"), timeout_s=10.0)
        limiter.clock = lambda: 30.0
        verdicts = [(await limiter.check("x")).allowed for _ in range(2)]
        admin.script_flush()  # redis-py loads the script again (SCRIPT LOAD on NOSCRIPT)
        other = RateLimiter("2/minute", server.user_url("gateway"), timeout_s=10.0)
        other.clock = limiter.clock  # a second replica: it asks the server, which says no
        verdicts.append((await other.check("x")).allowed)
        verdicts.append((await limiter.check("x")).allowed)
        await limiter.close()
        await other.close()
        return verdicts

    assert asyncio.run(scenario()) == [True, True, False, False]
    assert admin.keys("*") == [LIMITS]
    assert admin.acl_log() == []


# What each user must not do (`acl.USERS` gives none of it): (user, command).
FORBIDDEN = [
    *(("tools", c) for c in [
        ("XADD", CALLS, "*", "v", "1", "body", "{}"),  # queue calls as if an engine
        ("DEL", CALLS), ("XTRIM", CALLS, "MAXLEN", "0"), ("DEL", RESULTS),
        ("XTRIM", RESULTS, "MAXLEN", "0"), ("DEL", DEAD_LETTER_STREAM),
        ("XTRIM", DEAD_LETTER_STREAM, "MAXLEN", "0"),
        ("GET", LIMITS), ("LRANGE", LIMITS, "0", "-1"), ("SET", LIMITS, "1"),
        ("XREADGROUP", "GROUP", "engine", "w", "STREAMS", RESULTS, ">"),  # an engine's results
        ("GET", "interlude:tool-submitted:c1"),
        ("EVAL", "return redis.call('DEL', KEYS[1])", "1", CALLS),  # a script is no way round
        ("EVAL", "return redis.call('FLUSHALL')", "0"),
        ("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "SET", "maxmemory-policy", "noeviction"),
        ("CONFIG", "GET", "*"), ("ACL", "SETUSER", "intruder", "on", ">pw", "~*", "+@all"),
        ("ACL", "LIST"), ("KEYS", "*"), ("PUBLISH", "news", "x"),
    ]),
    *(("gateway", c) for c in [
        ("XADD", CALLS, "*", "v", "1", "body", "{}"), ("XREADGROUP", "GROUP", "tools", "w",
        "STREAMS", CALLS, ">"), ("XRANGE", CALLS, "-", "+"), ("XADD", RESULTS, "*", "v", "1"),
        ("DEL", CALLS), ("XTRIM", CALLS, "MAXLEN", "0"), ("HGETALL", "interlude:tools"),
        ("HSET", "interlude:tools", "x", "{}"), ("EVALSHA", "0" * 40, "1", CALLS),
        ("FLUSHALL",), ("CONFIG", "SET", "maxmemory-policy", "noeviction"), ("ACL", "LIST"),
    ]),
    *(("engine", c) for c in [
        ("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "SET", "maxmemory-policy", "noeviction"),
        ("CONFIG", "GET", "*"), ("ACL", "LIST"), ("DEL", CALLS), ("XTRIM", CALLS, "MAXLEN", "0"),
        ("XREADGROUP", "GROUP", "tools", "w", "STREAMS", CALLS, ">"),  # take calls as a worker
        ("XADD", RESULTS, "*", "v", "1"),  # forge a result
        ("HSET", "interlude:tools", "x", "{}"), ("GET", LIMITS), ("GET", "interlude:tool-done:c1"),
    ]),
]  # fmt: skip


def _run(url: str, command: tuple[str, ...]) -> str:
    """'refused', or 'ran' (an answer or any error but a permission one)."""
    with Redis.from_url(url) as client:
        try:
            client.execute_command(*command)
        except NoPermissionError:
            return "refused"
        except ResponseError as exc:  # a command inside a script is refused with ERR
            return "refused" if "ACL failure in script" in str(exc) else "ran"
    return "ran"


@pytest.mark.parametrize(
    ("user", "command"), FORBIDDEN, ids=[f"{u}-{' '.join(c[:2])}" for u, c in FORBIDDEN]
)
def test_what_a_user_must_not_do_is_refused(
    server: AclValkey, admin: Redis, user: str, command: tuple[str, ...]
) -> None:
    admin.xgroup_create(CALLS, TOOL_GROUP, id="0", mkstream=True)
    admin.xgroup_create(RESULTS, "engine", id="0", mkstream=True)
    assert _run(server.user_url(user), command) == "refused"
    assert admin.xinfo_stream(CALLS)["groups"] == 1  # the call stream is still there


def test_every_probe_runs_for_a_user_with_every_right(server: AclValkey, admin: Redis) -> None:
    """The control: the same commands by `~* &* +@all` are not refused, so the rules are what
    refuses them above (run last among probes that change the server: FLUSHALL, ACL SETUSER)."""
    admin.acl_setuser(
        "everything",
        enabled=True,
        passwords=["+pw"],
        keys=["*"],
        channels=["*"],
        commands=["+@all"],
    )
    admin.xgroup_create(CALLS, TOOL_GROUP, id="0", mkstream=True)
    admin.xgroup_create(RESULTS, "engine", id="0", mkstream=True)
    url = server.user_url("everything", "pw")
    try:
        ran = {command: _run(url, command) for _, command in FORBIDDEN}
    finally:
        admin.acl_deluser("everything", "intruder")
    assert set(ran.values()) == {"ran"}, [c for c, r in ran.items() if r != "ran"]


def test_a_call_submitted_by_a_worker_is_refused_but_an_engines_runs(
    server: AclValkey, admin: Redis
) -> None:
    call: ToolCall = build_call("x1", "calculator", {"expression": "1"})

    async def submit(user: str) -> str:
        redis = AsyncRedis.from_url(server.user_url(user), decode_responses=True)
        try:
            return await EngineBus(redis, "eng").submit(call)
        finally:
            await redis.aclose()

    with pytest.raises(ResponseError, match=r"ACL failure in script|No permissions"):
        asyncio.run(submit("tools"))
    assert asyncio.run(submit("engine"))
    assert admin.xlen(CALLS) == 1


def test_a_components_url_goes_to_its_log_without_the_password() -> None:
    from interlude.bus.streams import redacted

    url = "redis://tools:s3cr%40t@valkey.ns.svc:6379/0"
    assert redacted(url) == "redis://tools:***@valkey.ns.svc:6379/0"
    assert redacted("rediss://:pw@host:6380") == "rediss://:***@host:6380"
    assert redacted("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
