"""The "textworld" tool: a household text adventure, one command per call, state in Redis.

An agent plays it over many turns of one session (`ToolCall.session_id`), and any worker may
answer any turn, so the game's state cannot live in a worker: it is one JSON value per session
in the bus's Redis (`session_key`), with a TTL so an abandoned game goes away by itself. The
rules are pure and live apart (`interlude_tools.tools.textworld_game`); this module loads a state,
plays the command and stores the result.

A call may be run twice (a call reclaimed from a crashed worker is run again), and a command
must not be applied twice ("take mug" twice would be harmless; "go north" twice is not). So the
stored value also keeps the last few call ids with their answers, and a step is one WATCH/MULTI
transaction: a call id seen before gets its stored answer back and changes nothing; two steps
of one session at once are applied one after the other, never on the same old state.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.exceptions import WatchError

from interlude.bus.streams import connect
from interlude_tools.context import ToolEnv, current_call
from interlude_tools.registry import RetriableToolError, Tool, ToolArgumentError
from interlude_tools.tools.textworld_game import State, play

log = logging.getLogger(__name__)

KEY_PREFIX = "interlude:textworld:"
# Call ids remembered per session: a re-run comes soon after the first run (a claim timeout
# later), while the session has made at most a step or two more.
RECENT_CALLS = 8
# Tries of a step that lost its WATCH to another step of the same session, before giving up
# (as retriable: the registry tries again after a backoff).
MAX_ATTEMPTS = 16


def session_key(session_id: str) -> str:
    """The Redis key of a session's game: a JSON string (`Saved`)."""
    return f"{KEY_PREFIX}{session_id}"


@dataclass(frozen=True)
class Saved:
    """What is stored per session: the game, and the answers to its last few calls."""

    state: State | None  # None: no game yet (or one that could not be read)
    recent: tuple[tuple[str, str], ...] = ()  # (call id, answer), oldest first

    def encode(self) -> str:
        state = None if self.state is None else self.state.to_json()
        return json.dumps({"state": state, "recent": [list(pair) for pair in self.recent]})

    @classmethod
    def decode(cls, raw: str | bytes | None) -> Saved:
        """The stored value; an unreadable one (a different version, say) is a fresh start:
        a game lost is better than a session that fails on every turn."""
        if raw is None:
            return cls(None)
        try:
            data = json.loads(raw)
            state = None if data["state"] is None else State.from_json(data["state"])
            recent = tuple((str(c), str(a)) for c, a in data["recent"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("textworld: unreadable saved game, starting over: %r", exc)
            return cls(None)
        return cls(state, recent)

    def answer_for(self, call_id: str) -> str | None:
        return next((answer for seen, answer in self.recent if seen == call_id), None)


class SessionStore:
    """Games by session in Redis; `step` is atomic and idempotent per call id."""

    def __init__(self, redis: Redis, ttl_s: float) -> None:
        self._redis = redis
        self._ttl_ms = max(1, round(ttl_s * 1000))

    async def load(self, session_id: str) -> Saved:
        return Saved.decode(await self._redis.get(session_key(session_id)))

    async def step(self, session_id: str, call_id: str, command: str, game: int | None) -> str:
        """Play `command` in the session's game as call `call_id`, and store the result.

        If `call_id` was played already, its answer then, with nothing played or stored. The
        TTL starts again at each step: a game lasts as long as it is played.
        """
        key = session_key(session_id)
        for _ in range(MAX_ATTEMPTS):
            async with self._redis.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(key)
                    saved = Saved.decode(await pipe.get(key))
                    earlier = saved.answer_for(call_id)
                    if earlier is not None:
                        return earlier
                    state, answer = play(saved.state, command, game)
                    recent = (*saved.recent, (call_id, answer))[-RECENT_CALLS:]
                    pipe.multi()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
                    pipe.set(key, Saved(state, recent).encode(), px=self._ttl_ms)
                    await pipe.execute()
                    return answer
                except WatchError:
                    continue  # another step of this session got in first: play after it
        raise RetriableToolError(f"session {session_id!r} is busy: {MAX_ATTEMPTS} steps collided")


class TextWorld(Tool):
    """A household text adventure: {"command": "take mug"} -> what happens.

    Side effects: the session's game in Redis (`session_key`), applied once per call id.
    """

    name = "textworld"
    description = (
        "play a household text adventure, one command per call (look, go <direction>, "
        "take <object>, put <object> in/on <receptacle>, open <receptacle>, clean <object>, "
        "inventory, reset); the game keeps its state for the conversation"
    )
    MAX_COMMAND_CHARS = 200
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "command": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_COMMAND_CHARS,
                "pattern": "\\S",
                "description": "e.g. look, go north, take mug, put mug on table",
            },
            "game": {
                "type": "integer",
                "minimum": 0,
                "description": "which game to play; only read by the first command and reset",
            },
        },
        "required": ["command"],
        "additionalProperties": False,
    }

    def __init__(self, env: ToolEnv, *, ttl_s: float = 3600.0) -> None:
        """Games live in `env.redis_url`'s Redis for `ttl_s` seconds after their last step.

        The client connects on first use, in the event loop of the worker that runs the tool.
        """
        if not (math.isfinite(ttl_s) and ttl_s > 0):
            raise ValueError(f"ttl_s must be finite and > 0, got {ttl_s}")
        self._redis = connect(env.redis_url)  # a Sentinel URL too (`interlude.api.redis_url`)
        self.store = SessionStore(self._redis, ttl_s)

    async def aclose(self) -> None:
        """Close the tool's Redis connections."""
        await self._redis.aclose()

    async def run(self, arguments: dict[str, Any]) -> str:
        command = arguments.get("command")
        game = arguments.get("game")
        if not isinstance(command, str) or not command.strip():
            raise ToolArgumentError(f"argument 'command' must be a non-blank string: {command!r}")
        if len(command) > self.MAX_COMMAND_CHARS:
            raise ToolArgumentError(f"argument 'command' is longer than {self.MAX_COMMAND_CHARS}")
        if game is not None and (isinstance(game, bool) or not isinstance(game, int) or game < 0):
            raise ToolArgumentError(f"argument 'game' must be an integer >= 0, got {game!r}")
        call = current_call()
        try:
            return await self.store.step(call.session_id, call.call_id, command, game)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            # Safe to retry: a step that did reach Redis is not applied again.
            raise RetriableToolError(f"the game store is unreachable: {exc}") from exc
