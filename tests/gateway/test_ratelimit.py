"""Leased rate limits (`gateway.ratelimit`, `gateway.quota`): small limits are exact, large ones
cost a Redis round trip per lease rather than per request, replicas sharing one Valkey never
admit more than the limit between them, and the sliding window forgets the last period as it
passes. A real Valkey server; the limiter's clock is set where a test needs a given instant."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from interlude.gateway.quota import KEY_PREFIX, Grant, MemoryQuota, Window, grant_for
from interlude.gateway.ratelimit import Rate, RateLimiter


@pytest.fixture(scope="module")
def valkey(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from interlude.stack.valkey import Valkey

    server = Valkey(Path(tmp_path_factory.mktemp("valkey-rl")))
    url = server.start()
    try:
        yield url
    finally:
        server.stop()


@pytest.fixture
def url(valkey: str) -> str:
    with Redis.from_url(valkey) as admin:
        admin.flushall()
        admin.config_resetstat()
    return valkey


def _lease_calls(url: str) -> int:
    with Redis.from_url(url) as admin:
        stats = admin.info("commandstats")
    return sum(
        int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval")
    )


def _limiter(rate: str, url: str, now: float = 1_000_020.0) -> RateLimiter:
    limiter = RateLimiter(rate, url, timeout_s=10.0)
    limiter.clock = lambda: now
    return limiter


async def _admitted(limiter: RateLimiter, who: str, n: int) -> list[bool]:
    return [(await limiter.check(who)).allowed for _ in range(n)]


@pytest.mark.parametrize("store", ["memory", "valkey"])
def test_a_small_limit_is_exact_and_the_refusal_says_when_to_come_back(
    store: str, url: str
) -> None:
    async def scenario() -> tuple[list[bool], dict[str, str]]:
        limiter = _limiter("3/minute", url if store == "valkey" else "")
        got = await _admitted(limiter, "k", 4)
        refused = await limiter.check("k")
        await limiter.close()
        return got, refused.headers()

    got, headers = asyncio.run(scenario())
    assert got == [True, True, True, False]
    assert int(headers["retry-after"]) >= 1
    assert headers["x-ratelimit-remaining-requests"] == "0"


def test_two_replicas_on_one_valkey_never_admit_more_than_the_limit(url: str) -> None:
    """Each replica leases up to 1 % of the limit (and an eighth of the room) at a time; at the
    end the leases shrink to one request, so little of the limit goes unused."""

    async def scenario() -> tuple[int, int]:
        a, b = _limiter("1000/minute", url), _limiter("1000/minute", url)

        async def hammer(limiter: RateLimiter) -> int:
            return sum(await _admitted(limiter, "k", 700))

        counts = await asyncio.gather(hammer(a), hammer(b))
        trips = a.round_trips + b.round_trips
        await a.close()
        await b.close()
        return sum(counts), trips

    admitted, trips = asyncio.run(scenario())
    assert 990 <= admitted <= 1000
    assert trips < 1400 / 2  # most checks admitted from a lease, with no round trip


@pytest.mark.parametrize(("per_step", "step_s"), [(8, 0.25), (1, 0.625)])
def test_replicas_across_window_turns_keep_the_sliding_estimate_within_the_limit(
    per_step: int, step_s: float, url: str
) -> None:
    """Two replicas on one clock, each asked `per_step` times every `step_s` for three windows:
    at 4x the limit's rate, and at a fifth of it (96 requests a window each: 10 leases of 10,
    4 left unused at the turn). At every admission the sliding estimate of the requests
    admitted so far (by both) is within the limit, and at 4x it reaches it; at a fifth, every
    request passes. What a window counted and nobody admitted (leases left unused at its turn)
    is at most one lease per replica."""
    rate, start, period = Rate.parse("1000/minute"), 6000.0, 60.0  # 6000: window 100's start

    async def scenario() -> tuple[float, dict[int, int]]:
        now = [start]
        replicas = [
            RateLimiter("1000/minute", url, timeout_s=10.0, clock=lambda: now[0]) for _ in range(2)
        ]
        admitted: dict[int, int] = {}
        highest = 0.0
        while now[0] < start + 3 * period:
            verdicts = await asyncio.gather(*(_admitted(r, "k", per_step) for r in replicas))
            window = Window.at(now[0], period)
            for _ in range(sum(sum(v) for v in verdicts)):  # each admission, in turn
                admitted[window.index] = admitted.get(window.index, 0) + 1
                estimate = admitted.get(window.index - 1, 0) * window.weight
                highest = max(highest, estimate + admitted[window.index])
            now[0] += step_s
        for r in replicas:
            await r.close()
        return highest, admitted

    highest, admitted = asyncio.run(scenario())
    assert highest <= rate.amount
    if per_step == 8:
        assert highest >= rate.amount * 0.98
    else:
        assert sum(admitted.values()) == 2 * 3 * 96
    with Redis.from_url(url) as admin:
        for index in (100, 101, 102):
            counted = int(admin.get(f"{KEY_PREFIX}{{k}}:{index}") or 0)
            assert 0 <= counted - admitted[index] <= 2 * rate.lease, index


def test_a_large_limit_costs_a_round_trip_per_lease_not_per_request(url: str) -> None:
    async def scenario() -> list[bool]:
        limiter = _limiter("1000000/minute", url)
        got = await _admitted(limiter, "k", 2000)
        await limiter.close()
        return got

    assert all(asyncio.run(scenario()))
    # Leases of 10,000 (1 % of the limit): the first covers all 2,000 checks (a second script
    # call only if the server had to be sent the script first: NOSCRIPT).
    assert _lease_calls(url) <= 2


def test_concurrent_checks_of_one_key_share_one_lease(url: str) -> None:
    async def scenario() -> tuple[list[bool], int]:
        limiter = _limiter("60000/minute", url)
        got = await asyncio.gather(*(limiter.check("k") for _ in range(50)))
        await limiter.close()
        return [v.allowed for v in got], limiter.round_trips

    got, trips = asyncio.run(scenario())
    # One script call (two if the server had to be sent the script first: NOSCRIPT).
    assert all(got) and trips == 1 and _lease_calls(url) <= 2


def test_a_refused_key_is_refused_without_asking_until_its_window_has_room(url: str) -> None:
    async def scenario() -> tuple[list[bool], int, list[bool]]:
        now = [1_000_020.0]
        limiter = RateLimiter("2/minute", url, timeout_s=10.0, clock=lambda: now[0])
        first = await _admitted(limiter, "k", 5)
        trips = limiter.round_trips
        # Two windows on, the count is forgotten: admitted again.
        now[0] += 120.0
        later = await _admitted(limiter, "k", 3)
        await limiter.close()
        return first, trips, later

    first, trips, later = asyncio.run(scenario())
    assert first == [True, True, False, False, False]
    assert trips == 3  # two leases of one, one refusal; the last two refused locally
    assert later == [True, True, False]


@pytest.mark.parametrize("store", ["memory", "valkey"])
def test_the_sliding_window_weighs_the_last_window_by_what_is_left_of_it(
    store: str, url: str
) -> None:
    """100/minute, 80 admitted in one window: a quarter into the next, the estimate is
    80 x 0.75 = 60, so 40 more pass; three quarters in, 80 x 0.25 = 20 and 40 more."""

    async def scenario() -> list[int]:
        now = [600.0]  # a window's start (period 60 s)
        where = url if store == "valkey" else ""
        limiter = RateLimiter("100/minute", where, timeout_s=10.0, clock=lambda: now[0])
        counts = [sum(await _admitted(limiter, "k", 80))]
        now[0] = 660.0 + 15.0
        counts.append(sum(await _admitted(limiter, "k", 100)))
        now[0] = 660.0 + 45.0
        counts.append(sum(await _admitted(limiter, "k", 100)))
        await limiter.close()
        return counts

    assert asyncio.run(scenario()) == [80, 40, 40]


def test_grants_shrink_with_the_room_and_never_pass_the_limit() -> None:
    assert grant_for(1000, 10, 0.0, 0, 0) == 10
    assert grant_for(1000, 10, 0.0, 0, 950) == 6  # an eighth of the 50 left
    assert grant_for(1000, 10, 0.0, 0, 995) == 1
    assert grant_for(1000, 10, 0.0, 0, 999) == 1
    assert grant_for(1000, 10, 0.0, 0, 1000) == 0
    assert grant_for(1000, 10, 0.5, 1000, 499) == 1  # 500 + 499: room for one
    assert grant_for(1000, 10, 0.5, 1000, 500) == 0


def test_retry_after_is_when_the_estimate_leaves_room_for_one() -> None:
    window = Window.at(615.0, 60.0)  # a quarter into a window: the last one weighs 0.75
    assert window.weight == pytest.approx(0.75)
    # 100/minute, 100 last window, 30 now: room once 100 x w + 30 <= 99, w <= 0.69: at 31 %.
    wait = Grant(0, 100, 30).retry_after_s(100, window, 60.0)
    assert wait == pytest.approx((0.31 - 0.25) * 60.0)
    # This window full: through its end, then until 100 x w <= 99 in the next (1 % in).
    wait = Grant(0, 0, 100).retry_after_s(100, window, 60.0)
    assert wait == pytest.approx(0.75 * 60.0 + 0.01 * 60.0)


def test_the_memory_store_forgets_keys_beyond_its_bound() -> None:
    async def scenario() -> int:
        store = MemoryQuota(max_keys=3)
        for who in "abcde":
            await store.lease(who, Window(0, 1.0), 1, 10, 60.0)
        return len(store._counts)

    assert asyncio.run(scenario()) == 3


@pytest.mark.parametrize(
    ("text", "amount", "period_s"),
    [
        ("600/minute", 600, 60.0),
        ("10 per second", 10, 1.0),
        ("5/2 minutes", 5, 120.0),
        ("1200/Minute", 1200, 60.0),
        ("100 per hour", 100, 3600.0),
        (" 7/days ", 7, 86400.0),
    ],
)
def test_rates_parse(text: str, amount: int, period_s: float) -> None:
    assert Rate.parse(text) == Rate(amount, period_s)


@pytest.mark.parametrize("text", ["", "600", "600/fortnight", "-1/minute", "0/minute", "x/second"])
def test_bad_rates_are_refused_at_start(text: str) -> None:
    with pytest.raises(ValueError, match="rate"):
        RateLimiter(text)


def test_a_store_gone_away_leaves_the_verdicts_already_known(tmp_path: Path) -> None:
    """Valkey hangs (SIGSTOP): a key with no lease fails open (StoreAway, the guard counts it),
    but a key this replica already knows to be over its limit stays refused, and one with a
    lease left is still admitted from it: neither needs the store."""
    from interlude.gateway.ratelimit import StoreAway
    from interlude.stack.valkey import Valkey

    server = Valkey(tmp_path / "valkey")
    url = server.start()
    assert server.proc is not None
    pid = server.proc.pid

    async def scenario() -> list[bool]:
        limiter = RateLimiter("2/minute", url, timeout_s=0.3, pause_s=30.0, clock=lambda: 30.0)
        big = RateLimiter("1000/minute", url, timeout_s=0.3, pause_s=30.0, clock=lambda: 30.0)
        got = await _admitted(limiter, "over", 3)  # True, True, then refused
        got.append((await big.check("leased")).allowed)  # a lease of 10: 9 left
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(StoreAway):
                await limiter.check("new")
            with pytest.raises(StoreAway):
                await big.check("new")
            got.append((await limiter.check("over")).allowed)
            got.append((await big.check("leased")).allowed)
        finally:
            os.kill(pid, signal.SIGCONT)
        return got

    try:
        assert asyncio.run(scenario()) == [True, True, False, True, False, True]
    finally:
        server.stop()


def test_a_hung_rate_limit_store_costs_one_timeout_then_is_skipped(tmp_path: Path) -> None:
    """Valkey stopped (SIGSTOP: connected, silent, as in a partition): one check waits out the
    timeout, the next ones are skipped at once (the guard fails open), and once the pause is
    over and the server is back, requests are counted again."""
    from interlude.gateway.ratelimit import RateLimiter, StoreAway
    from interlude.stack.valkey import Valkey

    server = Valkey(tmp_path / "valkey")
    url = server.start()
    assert server.proc is not None
    limiter = RateLimiter("100/minute", url, timeout_s=0.3, pause_s=0.5)

    async def scenario() -> None:
        assert (await limiter.check("k")).allowed
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(StoreAway):
                await limiter.check("k")
            assert time.monotonic() - started < 1.0
            started = time.monotonic()
            with pytest.raises(StoreAway, match="not asked again"):
                await limiter.check("k")
            assert time.monotonic() - started < 0.05
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        await asyncio.sleep(0.6)
        assert (await limiter.check("k")).allowed

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
