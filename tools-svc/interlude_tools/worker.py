"""The tool executor: take calls from the call stream, run them, post results to their engines.

Why nothing is lost when a worker dies, and nothing is answered twice:

* A call stays pending in `TOOL_GROUP` until the worker that read it acknowledges it. A live
  worker re-claims its running calls every `claim_idle_ms / 3` (XCLAIM resets their idle
  time), so only a dead worker's calls go idle for `claim_idle_ms`; other workers then take
  them over (XPENDING, then XCLAIM: `reclaim_once`) and run them again. The re-claim runs on
  a thread of its own with its own connection (`Heartbeat`): a tool that blocks the event
  loop cannot starve it and have its call stolen and run twice.
* Posting is one Lua script (`interlude.bus.worker_side`, with every other Redis command of
  the worker's side), so atomic: SET the call's done key NX (with a TTL), XADD the result only
  if that SET won, then XACK and XDEL the call. A crash before the script leaves the call
  pending (it is reclaimed and run again); after it, the call is finished. If two workers ever
  run one call (say a worker stalled longer than `claim_idle_ms`), the second post finds the
  done key and only acknowledges. A post that fails (Redis away) is retried with backoff,
  with the result kept: the tool is not run again.
* Before running a reclaimed call the worker checks the done key, so a call that was already
  answered is acknowledged without running the tool again. A first delivery (read with ">")
  skips the check, a round trip saved per call: a call entry is queued once per call id (the
  engine's idempotent submit) and only its reader can have answered it, and a Redis restart
  keeps a prefix of the AOF, in which the post script's writes are all or nothing.
* The engine also drops results whose `call_id` it has seen: the last line of defence.
* A reclaimed call delivered `SOLO_AFTER` times or more was running in at least two workers
  that died: it may be what killed them. It runs alone (no other call in flight, nothing read
  meanwhile), so a poison call takes only itself down on its way to the dead-letter stream,
  and the calls that merely shared a worker with it are not dead-lettered alongside it (the
  fault drill caught 15 of them going that way).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from interlude.api.bus import ProtocolError, ToolCall, ToolResult
from interlude.bus.heartbeat import Heartbeat, sync_client
from interlude.bus.streams import Backoff, StreamEntry, as_text, raise_if_cancelled
from interlude.bus.worker_side import WorkerBus
from interlude_tools import observe
from interlude_tools.registry import Registry

log = logging.getLogger(__name__)
T = TypeVar("T")
Entry = StreamEntry  # (call entry id, its fields; None: deleted)

# Deliveries after which a reclaimed call runs alone (see the module docstring). Below
# `max_deliveries`, so a call that only shared a dying worker with a poison call twice is
# isolated, and then answered, before it could be dead-lettered.
SOLO_AFTER = 3


def _plan_claims(
    idle: list[dict[str, Any]], free: int, max_deliveries: int, inflight: Mapping[str, object]
) -> dict[str, int]:
    """Which idle entries to claim (oldest first), each with its delivery count once claimed."""
    plan: dict[str, int] = {}
    suspect = False
    for row in idle:
        entry_id, count = as_text(row["message_id"]), int(row["times_delivered"]) + 1
        if entry_id in inflight:
            continue
        if count > max_deliveries:
            plan[entry_id] = count  # dead-lettered, not run: takes no slot
        elif count >= SOLO_AFTER:
            if not suspect:
                plan[entry_id], suspect = count, True
        elif free > 0:
            plan[entry_id], free = count, free - 1
    return plan


class Worker:
    """One tool-executor consumer in `TOOL_GROUP`.

    Side effects: creates the call stream and group; acknowledges and deletes call entries;
    appends results to engines' result streams; sets done keys. Invariants: at most
    `concurrency` calls run at once, and no more are read than can start; every entry read
    is acknowledged exactly when its result is posted, or when it is undecodable or already
    answered. `stop()` drains running calls (up to `drain_timeout_s`); cancelling `run()`
    abandons them, leaving them pending for another worker to reclaim.
    """

    def __init__(
        self,
        redis: Redis,
        consumer_name: str,
        registry: Registry,
        *,
        claim_idle_ms: int = 30_000,
        concurrency: int = 16,
        block_ms: int = 1000,
        done_ttl_s: int = 3600,
        result_ttl_s: int = 86_400,
        drain_timeout_s: float = 10.0,
        max_deliveries: int = 5,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if min(concurrency, claim_idle_ms, block_ms, done_ttl_s, result_ttl_s, max_deliveries) < 1:
            raise ValueError("counts, times and TTLs of a Worker must be >= 1")
        self.redis = redis
        self.consumer = consumer_name
        self.registry = registry
        self.claim_idle_ms = claim_idle_ms
        self.concurrency = concurrency
        self.block_ms = block_ms
        self.bus = WorkerBus(redis, consumer_name, done_ttl_s, result_ttl_s)
        self.drain_timeout_s = drain_timeout_s
        # A reclaimed call delivered more often than this is a poison call (`deadletter`).
        self.max_deliveries = max_deliveries
        self.clock = clock
        self._inflight: dict[str, asyncio.Task[ToolResult | None]] = {}
        self._suspects: deque[Entry] = deque()  # reclaimed calls waiting to run alone
        self._solo: asyncio.Task[ToolResult | None] | None = None  # the one running alone
        self.heartbeat = Heartbeat(
            sync_client(redis.connection_pool.connection_kwargs),
            consumer_name,
            claim_idle_ms / 3000,
        )
        self._stopping = asyncio.Event()
        self._read_backoff = Backoff()
        self.posted = 0  # results this worker posted
        self.skipped = 0  # calls acknowledged without a post: already answered, or undecodable
        self.redis_retries = 0  # commands for a call retried after a Redis connection error
        self.dead_lettered = 0  # poison calls moved to the dead-letter stream

    async def setup(self) -> None:
        await self.bus.setup()

    def stop(self) -> None:
        """Ask `run` to stop reading and drain; returns at once. A worker runs once."""
        self._stopping.set()

    async def run(self) -> None:
        """Read, run and post calls until `stop()`; reclaims dead workers' calls meanwhile."""
        await self.setup()
        self.heartbeat.start()
        claimer = asyncio.create_task(self._claim_loop())
        try:
            while not self._stopping.is_set():
                if self._isolating():
                    await self._run_suspect()
                    continue
                free = self.concurrency - len(self._inflight)
                if free == 0:
                    await asyncio.wait(
                        list(self._inflight.values()), return_when=asyncio.FIRST_COMPLETED
                    )
                    continue
                entries = await self._read(free)
                raise_if_cancelled()
                self._start(entries, reclaimed=False)
        except asyncio.CancelledError:
            for task in self._inflight.values():
                task.cancel()
            raise
        finally:
            # Set as well as cancel: a cancellation inside a Redis command can be swallowed
            # (see raise_if_cancelled), and the claim loop also ends on this flag.
            self._stopping.set()
            claimer.cancel()
            await asyncio.gather(claimer, return_exceptions=True)
            await self._drain()
            await asyncio.to_thread(self.heartbeat.stop)

    async def reclaim_once(self) -> int:
        """Take over calls idle longer than `claim_idle_ms` (this worker's own are kept fresh
        by its heartbeat); returns how many were taken over. It looks before it claims
        (XPENDING with their delivery counts, then XCLAIM of the chosen ones), because a
        claim counts a delivery: up to the free slots of ordinary calls, at most one suspect
        (to run alone), and any call delivered more than `max_deliveries` times, which is
        dead-lettered instead of run. A suspect never waits in a worker behind another
        suspect: if that one is a poison call, the worker's death would count against both."""
        free = self.concurrency - len(self._inflight)
        if free <= 0 or self._isolating():  # a suspect runs alone: take on nothing more
            return 0
        idle = await self.bus.idle(4 * self.concurrency, self.claim_idle_ms)
        plan = _plan_claims(idle, free, self.max_deliveries, self._inflight)
        if not plan:
            return 0
        claimed = await self.bus.claim(list(plan), self.claim_idle_ms)
        runnable: list[Entry] = []
        for entry_id, fields in claimed:
            count = plan[entry_id]
            if count > self.max_deliveries:
                await self.bus.dead_letter(entry_id, fields, count)
                self.dead_lettered += 1
                observe.DEAD.inc()
                continue
            log.info("reclaimed call entry %s (delivery %d)", entry_id, count)
            if count >= SOLO_AFTER:
                self._suspects.append((entry_id, fields))
                self.heartbeat.add(entry_id)  # ours while what is in flight finishes
                continue
            runnable.append((entry_id, fields))
        self._start(runnable, reclaimed=True)
        return len(runnable) + len(self._suspects)

    async def process(
        self, entry_id: str, fields: Mapping[Any, Any] | None, *, reclaimed: bool = True
    ) -> ToolResult | None:
        """Handle one call entry to the end; returns the result it posted (None: none posted).

        `reclaimed=False` (a first delivery) skips the done check; see the module docstring."""
        try:
            call = ToolCall.decode(fields or {})
        except ProtocolError as exc:
            log.warning("acknowledging undecodable call entry %s: %s", entry_id, exc)
            await self._skip(entry_id)
            return None
        if reclaimed and await self._answered(call):
            log.info("call %s already answered; acknowledging entry %s", call.call_id, entry_id)
            await self._skip(entry_id)
            return None
        started = self.clock()
        result = await self.registry.execute(call, self.clock)
        observe.record(result, call.tool, self.clock() - started)
        fresh = await self._post(call, entry_id, result)
        log.info(
            "call %s tool=%s engine=%s session=%s ok=%s %.3fs%s%s",
            call.call_id,
            call.tool,
            call.engine_id,
            call.session_id,
            result.ok,
            self.clock() - started,
            f" error={result.error!r}" if result.error else "",
            "" if fresh else " (answered elsewhere first; not posted)",
        )
        if not fresh:
            self.skipped += 1
            return None
        self.posted += 1
        return result

    async def _answered(self, call: ToolCall) -> bool:
        """Whether a result for `call` was posted already (its done key is set)."""
        return await self._retrying(call, "checking", lambda: self.bus.answered(call))

    async def _post(self, call: ToolCall, entry_id: str, result: ToolResult) -> bool:
        """Post `result` and acknowledge the call (`WorkerBus.post`); whether it was the first
        post. The tool has run: running it again (by leaving the call to a reclaim) is what a
        failed post must not cause, so the post is retried (`_retrying`)."""
        return await self._retrying(call, "posting", lambda: self.bus.post(call, entry_id, result))

    async def _retrying(self, call: ToolCall, doing: str, command: Callable[[], Awaitable[T]]) -> T:
        """`command` until Redis answers: connection errors and timeouts (a restart, a stale
        pooled connection, a blip) are retried with backoff until the worker is cancelled.
        Left to a reclaim instead, the call would wait `claim_idle_ms`; the heartbeat keeps it
        this worker's meanwhile."""
        backoff = Backoff()
        while True:
            try:
                return await command()
            except (RedisConnectionError, RedisTimeoutError) as exc:
                log.warning("%s call %s failed (%s); retrying", doing, call.call_id, exc)
                self.redis_retries += 1
                await asyncio.sleep(backoff.next())

    async def _skip(self, entry_id: str) -> None:
        await self.bus.skip(entry_id)
        self.skipped += 1

    def _start(
        self, entries: list[tuple[str, Mapping[Any, Any] | None]], *, reclaimed: bool
    ) -> None:
        for entry_id, fields in entries:
            task = asyncio.create_task(self._guarded(entry_id, fields, reclaimed), name=entry_id)
            self._inflight[entry_id] = task
            self.heartbeat.add(entry_id)
            observe.RUNNING.inc()
            task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[ToolResult | None]) -> None:
        # Tasks are named by their entry id; one entry never runs twice in one worker.
        self._inflight.pop(task.get_name(), None)
        self.heartbeat.discard(task.get_name())
        observe.RUNNING.dec()

    async def _guarded(
        self, entry_id: str, fields: Mapping[Any, Any] | None, reclaimed: bool
    ) -> ToolResult | None:
        # A Redis error here leaves the entry pending: logged, and reclaimed later.
        try:
            return await self.process(entry_id, fields, reclaimed=reclaimed)
        except Exception:
            log.exception("call entry %s failed; left pending for reclaim", entry_id)
            return None

    async def _read(self, count: int) -> list[tuple[str, Mapping[Any, Any] | None]]:
        try:
            entries = await self.bus.read(count, self.block_ms)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            # Redis restarting or a network blip: the pod stays up and retries, backing off.
            wait = self._read_backoff.next()
            log.warning("reading calls failed (%s); retrying in %.2f s", exc, wait)
            await asyncio.sleep(wait)
            return []
        self._read_backoff.reset()
        return entries

    def _isolating(self) -> bool:
        return bool(self._suspects) or (self._solo is not None and not self._solo.done())

    async def _run_suspect(self) -> None:
        """One step towards running the next suspect alone: wait for what is in flight (the
        calls started before it, or the suspect itself), else start it."""
        if self._inflight:
            await asyncio.wait(list(self._inflight.values()), return_when=asyncio.FIRST_COMPLETED)
            return
        entry_id, fields = self._suspects.popleft()
        self._start([(entry_id, fields)], reclaimed=True)
        self._solo = self._inflight.get(entry_id)

    async def _claim_loop(self) -> None:
        interval = self.claim_idle_ms / 3000
        while not self._stopping.is_set():
            try:
                await self.reclaim_once()
            except Exception:
                log.exception("reclaim failed; retrying in %.2f s", interval)
            raise_if_cancelled()
            await asyncio.sleep(interval)

    async def _drain(self) -> None:
        tasks = list(self._inflight.values())
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=self.drain_timeout_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
