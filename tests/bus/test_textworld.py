"""The "textworld" tool: its rules (pure), and its state in a real Redis shared by workers.

Sync tests driving coroutines with `asyncio.run`, as in the rest of tests/bus/. Each scenario
builds its own tool (a Redis client belongs to the event loop it first ran on).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from typing import Any

import pytest
from redis.asyncio import Redis

from interlude.api.bus import ToolCall, ToolResult
from interlude.bus import EngineBus
from interlude_tools import Registry, ToolArgumentError, Worker
from interlude_tools.context import ToolEnv, answering
from interlude_tools.tools.textworld import TextWorld, session_key
from interlude_tools.tools.textworld_game import State, play
from interlude_tools.tools.textworld_layouts import LAYOUTS

EngineFactory = Callable[..., AbstractAsyncContextManager[EngineBus]]
WorkerFactory = Callable[..., AbstractAsyncContextManager[Worker]]
Collect = Callable[..., Awaitable[list[ToolResult]]]
Turn = Callable[..., ToolCall]

# A winning walkthrough of each layout (game seed = index).
WALKTHROUGHS = (
    ["look", "open cabinet", "take mug", "clean mug", "go north", "put mug on table"],
    ["open the drawer", "take cloth", "e", "s", "wash cloth in basin", "n", "put cloth on shelf"],
    ["take apple from basket", "east", "clean apple", "open fridge", "put apple into fridge"],
)


@pytest.fixture
def turn(make_call: Callable[..., ToolCall]) -> Turn:
    """`turn(session, command, call_id=None, **arguments)`: a textworld call of `session`."""
    ids = itertools.count()

    def build(session: str, command: str, call_id: str | None = None, **extra: Any) -> ToolCall:
        call = make_call(call_id or f"t{next(ids)}", "textworld", {"command": command, **extra})
        return replace(call, session_id=session)

    return build


@asynccontextmanager
async def textworld(redis_url: str, **options: Any) -> AsyncIterator[tuple[TextWorld, Registry]]:
    tool = TextWorld(ToolEnv(redis_url), **options)
    try:
        yield tool, Registry([tool])
    finally:
        await tool.aclose()


async def answer(registry: Registry, call: ToolCall) -> str:
    result = await registry.execute(call)
    assert result.ok, result.error
    return result.content


async def state_of(tool: TextWorld, session: str) -> State:
    state = (await tool.store.load(session)).state
    assert state is not None
    return state


@pytest.mark.parametrize("game", range(len(LAYOUTS)))
def test_every_layout_can_be_won(game: int) -> None:
    state, text = play(None, "look", game)
    assert not state.won and "Your task: put a clean" in text
    for command in WALKTHROUGHS[game][:-1]:
        state, text = play(state, command)
        assert not state.won, (command, text)
    state, text = play(state, WALKTHROUGHS[game][-1])
    assert state.won and "Task complete" in text, text
    assert f"Score: 1/1 in {state.moves} moves" in text
    # Won is won: the game stops taking moves until it is reset.
    after, text = play(state, "take apple")
    assert after == state and "reset" in text


def test_the_goal_needs_a_clean_object() -> None:
    state, _ = play(None, "look", 0)
    for command in ["open cabinet", "take mug", "go north", "put mug on table"]:
        state, text = play(state, command)
    assert not state.won and "Task complete" not in text
    assert "a dirty mug" in play(state, "look")[1]


def test_a_scripted_walkthrough_wins_through_the_registry(redis_url: str, turn: Turn) -> None:
    async def scenario() -> tuple[list[str], State, int]:
        async with textworld(redis_url) as (tool, registry):
            texts = [await answer(registry, turn("s1", c)) for c in WALKTHROUGHS[0]]
            async with Redis.from_url(redis_url) as r:
                ttl = await r.ttl(session_key("s1"))
            return texts, await state_of(tool, "s1"), ttl

    texts, state, ttl = asyncio.run(scenario())
    assert "You are in the kitchen" in texts[0] and "cabinet (closed)" in texts[0]
    assert texts[2] == "You take the mug from the cabinet."
    assert "You are in the dining room" in texts[4]
    assert texts[-1].startswith("You put the mug on the table.")
    assert "Task complete" in texts[-1] and "Score: 1/1 in 6 moves" in texts[-1]
    assert state.won and state.room == "dining room" and state.where["mug"] == "table"
    assert 3500 < ttl <= 3600  # the default TTL, started again by each step


def test_state_is_shared_across_workers(
    redis_url: str,
    turn: Turn,
    open_engine: EngineFactory,
    open_worker: WorkerFactory,
    collect: Collect,
) -> None:
    async def ask(bus: EngineBus, call: ToolCall) -> ToolResult:
        await bus.submit(call)
        [result] = await collect(bus, 1)
        return result

    async def scenario() -> list[ToolResult]:
        async with (
            textworld(redis_url) as (_, first),
            textworld(redis_url) as (_, second),
            open_engine() as bus,
        ):
            async with open_worker("w1", first):
                results = [await ask(bus, turn("g", c)) for c in ["open cabinet", "take mug"]]
            # w1 has stopped: only w2 (another tool, another client: another pod) can answer.
            async with open_worker("w2", second):
                results += [await ask(bus, turn("g", c)) for c in ["inventory", "go north"]]
            return results

    results = asyncio.run(scenario())
    assert all(r.ok for r in results), [r.error for r in results]
    assert [r.session_id for r in results] == ["g"] * 4
    assert results[1].content == "You take the mug from the cabinet."
    assert results[2].content == "You are carrying a dirty mug."
    assert "You are in the dining room" in results[3].content


def test_a_call_run_twice_is_applied_once(redis_url: str, turn: Turn) -> None:
    async def scenario() -> tuple[list[str], State, list[str], State]:
        async with textworld(redis_url) as (tool, registry):
            north = turn("s", "go north", call_id="c1")
            first = [await answer(registry, north), await answer(registry, north)]
            after_one = await state_of(tool, "s")
            # Run at once (a reclaimed call racing its first run): still applied once.
            south = turn("s", "go south", call_id="c2")
            raced = list(await asyncio.gather(answer(registry, south), answer(registry, south)))
            # A later step does not make an earlier call new again.
            raced.append(await answer(registry, north))
            return first, after_one, raced, await state_of(tool, "s")

    first, after_one, raced, final = asyncio.run(scenario())
    assert first[0] == first[1] and "You are in the dining room" in first[0]
    assert (after_one.room, after_one.moves) == ("dining room", 1)
    assert raced[0] == raced[1] and "You are in the kitchen" in raced[0]
    assert raced[2] == first[0]
    assert (final.room, final.moves) == ("kitchen", 2)


def test_concurrent_steps_of_a_session_all_apply(redis_url: str, turn: Turn) -> None:
    async def scenario() -> State:
        async with textworld(redis_url) as (tool, registry):
            await answer(registry, turn("s", "look"))
            await asyncio.gather(*(answer(registry, turn("s", "inventory")) for _ in range(6)))
            return await state_of(tool, "s")

    assert asyncio.run(scenario()).moves == 7  # no step was lost to another's write


def test_sessions_are_isolated(redis_url: str, turn: Turn) -> None:
    async def scenario() -> list[str]:
        async with textworld(redis_url) as (_, registry):
            await answer(registry, turn("a", "open cabinet"))
            await answer(registry, turn("a", "take mug"))
            commands = [("b", "inventory"), ("b", "look"), ("a", "inventory")]
            return [await answer(registry, turn(s, c)) for s, c in commands]

    b_inventory, b_look, a_inventory = asyncio.run(scenario())
    assert b_inventory == "You are carrying nothing."
    assert "cabinet (closed)" in b_look
    assert a_inventory == "You are carrying a dirty mug."


def test_reset_starts_over_and_picks_the_game(redis_url: str, turn: Turn) -> None:
    async def scenario() -> tuple[list[str], State]:
        async with textworld(redis_url) as (tool, registry):
            texts = [await answer(registry, turn("s", "look", game=1))]
            for command in ["open drawer", "take cloth", "go east"]:
                await answer(registry, turn("s", command))
            texts.append(await answer(registry, turn("s", "reset")))
            texts.append(await answer(registry, turn("s", "inventory")))
            texts.append(await answer(registry, turn("s", "reset", game=2)))
            texts.append(await answer(registry, turn("s", "look", game=0)))  # game is ignored
            return texts, await state_of(tool, "s")

    texts, state = asyncio.run(scenario())
    assert "You are in the bedroom" in texts[0]
    assert texts[1].startswith("You start over.") and "You are in the bedroom" in texts[1]
    assert "drawer (closed)" in texts[1]
    assert texts[2] == "You are carrying nothing."
    assert "You are in the garden" in texts[3] and "You are in the garden" in texts[4]
    assert (state.game, state.moves) == (2, 1)


def test_an_unknown_command_lists_the_commands(redis_url: str, turn: Turn) -> None:
    async def scenario() -> tuple[ToolResult, State]:
        async with textworld(redis_url) as (tool, registry):
            await answer(registry, turn("s", "look"))
            result = await registry.execute(turn("s", "dance wildly"))
            return result, await state_of(tool, "s")

    result, state = asyncio.run(scenario())
    assert result.ok and "I don't understand 'dance wildly'" in result.content
    for command in ["go <direction>", "take <object>", "put <object> in/on", "reset"]:
        assert command in result.content
    assert state.moves == 1


@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"command": 3},
        {"command": ""},
        {"command": "   "},
        {"command": "x" * 201},
        {"command": "look", "game": -1},
        {"command": "look", "game": "1"},
        {"command": "look", "players": 2},
    ],
)
def test_bad_arguments_are_refused(
    redis_url: str, make_call: Callable[..., ToolCall], arguments: dict[str, Any]
) -> None:
    async def scenario() -> tuple[ToolResult, int]:
        async with textworld(redis_url) as (_, registry):
            result = await registry.execute(make_call("bad", "textworld", arguments))
            async with Redis.from_url(redis_url) as r:
                return result, await r.exists(session_key("s-bad"))

    result, stored = asyncio.run(scenario())
    assert not result.ok and result.error_kind == "bad_arguments", result.error
    assert stored == 0


def test_run_checks_its_arguments_without_the_registry(
    redis_url: str, make_call: Callable[..., ToolCall]
) -> None:
    async def scenario() -> None:
        async with textworld(redis_url) as (tool, _):
            with answering(make_call("c", "textworld", {})):
                await tool.run({"command": "  "})

    with pytest.raises(ToolArgumentError, match="non-blank"):
        asyncio.run(scenario())


def test_an_unreadable_saved_game_starts_over(redis_url: str, turn: Turn) -> None:
    async def scenario() -> str:
        async with Redis.from_url(redis_url) as r:
            await r.set(session_key("s"), "{not json")
        async with textworld(redis_url) as (_, registry):
            return await answer(registry, turn("s", "look"))

    assert "You are in the kitchen" in asyncio.run(scenario())


def test_ttl_is_configurable_and_checked(redis_url: str, turn: Turn) -> None:
    async def scenario() -> int:
        async with textworld(redis_url, ttl_s=60) as (_, registry):
            await answer(registry, turn("s", "look"))
            async with Redis.from_url(redis_url) as r:
                return int(await r.pttl(session_key("s")))

    assert 59_000 < asyncio.run(scenario()) <= 60_000
    with pytest.raises(ValueError, match="ttl_s"):
        TextWorld(ToolEnv(redis_url), ttl_s=0)


def test_an_unreachable_store_is_retried_then_fails(
    free_port: Callable[[], int], turn: Turn
) -> None:
    async def scenario() -> ToolResult:
        async with textworld(f"redis://127.0.0.1:{free_port()}") as (_, registry):
            return await registry.execute(turn("s", "look"))

    result = asyncio.run(scenario())
    assert not result.ok and result.error_kind == "tool_error"
    assert "unreachable" in result.error and "after 3 attempts" in result.error
