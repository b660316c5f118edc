"""The rules of the "textworld" tool's household game: pure functions of (state, command).

A few small, fixed houses (`interlude_tools.tools.textworld_layouts`) in the spirit of ALFWorld's
household tasks ("put a clean mug on the table"): rooms joined by exits, receptacles (some
closed until opened, some sinks), objects in them, and one goal. No randomness and no I/O: the
same state and command always give the same next state and answer, so a step can be replayed,
stored and tested without Redis; the tool (`interlude_tools.tools.textworld`) keeps the state
between calls.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from interlude_tools.tools.textworld_layouts import LAYOUTS, Layout, Receptacle

INVENTORY = "@inventory"  # the `where` of an object the player carries
DIRECTIONS = {"n": "north", "s": "south", "e": "east", "w": "west", "u": "up", "d": "down"}
COMMANDS = (
    "look, go <direction>, take <object>, put <object> in/on <receptacle>, "
    "open <receptacle>, close <receptacle>, clean <object> (at a sink), inventory, help, reset"
)
_ARTICLES = {"the", "a", "an", "some"}


@dataclass(frozen=True)
class State:
    """Where a game stands; stored as JSON between calls (`to_json`, `from_json`)."""

    game: int  # the seed the layout was picked with (LAYOUTS[game % len(LAYOUTS)])
    room: str
    where: Mapping[str, str]  # object -> its receptacle, or INVENTORY
    dirty: frozenset[str]
    opened: frozenset[str]  # openable receptacles that are open
    moves: int = 0  # commands played since the game (re)started
    won: bool = False

    @property
    def layout(self) -> Layout:
        return LAYOUTS[self.game % len(LAYOUTS)]

    def to_json(self) -> dict[str, Any]:
        return {
            "game": self.game,
            "room": self.room,
            "where": dict(self.where),
            "dirty": sorted(self.dirty),
            "opened": sorted(self.opened),
            "moves": self.moves,
            "won": self.won,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> State:
        """The state `to_json` wrote; ValueError (or KeyError/TypeError) if it is not one."""
        state = cls(
            int(data["game"]),
            str(data["room"]),
            {str(k): str(v) for k, v in data["where"].items()},
            frozenset(map(str, data["dirty"])),
            frozenset(map(str, data["opened"])),
            int(data["moves"]),
            bool(data["won"]),
        )
        if state.room not in state.layout.exits or set(state.where) != set(state.layout.objects):
            raise ValueError("the stored state does not fit its layout")
        return state


def new_game(game: int) -> State:
    layout = LAYOUTS[game % len(LAYOUTS)]
    return State(game, layout.start, dict(layout.objects), layout.dirty, frozenset())


def play(state: State | None, command: str, game: int | None = None) -> tuple[State, str]:
    """The state after `command`, and the answer. No state: a new game (`game`, default 0);
    "reset" starts over (with `game` if given, else the same one); `game` is otherwise unused.
    """
    words = [w for w in re.findall(r"[a-z0-9']+", command.lower()) if w not in _ARTICLES]
    if state is None or words == ["reset"]:
        seed = game if game is not None else (0 if state is None else state.game)
        fresh = new_game(seed)
        if words == ["reset"]:
            return fresh, "You start over.\n\n" + _look(fresh)
        state = fresh
    verb, rest = (words[0], words[1:]) if words else ("", [])
    if state.won and verb not in ("look", "l", "inventory", "i", "help"):
        return state, f"The task is done. {_score(state)}. Say 'reset' to play again."
    handler = _HANDLERS.get(verb)
    if handler is None and (verb in DIRECTIONS or verb in DIRECTIONS.values()):
        handler, rest = _go, words
    if handler is None:
        return state, f"I don't understand {command.strip()!r}. Commands: {COMMANDS}."
    after, answer = handler(state, rest)
    after = replace(after, moves=state.moves + 1)
    item, place = after.layout.goal
    if not after.won and after.where[item] == place and item not in after.dirty:
        after = replace(after, won=True)
        answer += f"\n\nTask complete: you {after.layout.task}. {_score(after)}."
    return after, answer


def _score(state: State) -> str:
    return f"Score: {1 if state.won else 0}/1 in {state.moves} moves"


def _a(item: str, state: State) -> str:
    """ "a dirty mug", "an apple": an object as the player sees it."""
    described = f"dirty {item}" if item in state.dirty else item
    return ("an " if described[0] in "aeiou" else "a ") + described


def _visible(state: State, receptacle: Receptacle) -> bool:
    return not receptacle.openable or receptacle.name in state.opened


def _contents(state: State, receptacle: Receptacle) -> list[str]:
    return sorted(item for item, where in state.where.items() if where == receptacle.name)


def _look(state: State) -> str:
    layout = state.layout
    here = [r for r in layout.receptacles if r.room == state.room]
    seen = [_a(r.name, state) + ("" if _visible(state, r) else " (closed)") for r in here]
    lines = [f"You are in the {state.room}. You see {', '.join(seen)}."]
    for r in here:
        items = _contents(state, r) if _visible(state, r) else []
        if items:
            things = ", ".join(_a(i, state) for i in items)
            lines.append(f"{r.preposition.capitalize()} the {r.name}: {things}.")
    exits = layout.exits[state.room]
    lines.append("Exits: " + ", ".join(f"{d} to the {room}" for d, room in exits.items()) + ".")
    lines.append(f"Your task: {layout.task}.")
    return "\n".join(lines)


def _inventory(state: State, _: list[str]) -> tuple[State, str]:
    held = [_a(i, state) for i, where in sorted(state.where.items()) if where == INVENTORY]
    return state, "You are carrying " + (", ".join(held) if held else "nothing") + "."


def _help(state: State, _: list[str]) -> tuple[State, str]:
    return state, f"Commands: {COMMANDS}.\nYour task: {state.layout.task}."


def _go(state: State, words: list[str]) -> tuple[State, str]:
    words = [w for w in words if w != "to"]
    direction = DIRECTIONS.get(words[0], words[0]) if len(words) == 1 else ""
    exits = state.layout.exits[state.room]
    if direction not in exits:
        options = ", ".join(exits)
        return state, f"You can't go {' '.join(words) or 'nowhere'} from here. Exits: {options}."
    moved = replace(state, room=exits[direction])
    return moved, _look(moved)


def _here(state: State, name: str) -> Receptacle | None:
    receptacle = state.layout.receptacle(name)
    return receptacle if receptacle is not None and receptacle.room == state.room else None


def _split(words: list[str], separators: set[str]) -> tuple[str, str]:
    """("mug", "table") from "mug on table": the words before and after the first separator."""
    at = next((i for i, w in enumerate(words) if w in separators), len(words))
    return " ".join(words[:at]), " ".join(w for w in words[at + 1 :] if w not in separators)


def _take(state: State, words: list[str]) -> tuple[State, str]:
    item, _ = _split(words, {"from", "off", "out"})
    where = state.where.get(item)
    if where == INVENTORY:
        return state, f"You already have the {item}."
    receptacle = _here(state, where) if where else None
    if receptacle is None or not _visible(state, receptacle):
        return state, f"You see no {item or 'such thing'} here."
    taken = replace(state, where={**state.where, item: INVENTORY})
    return taken, f"You take the {item} from the {receptacle.name}."


def _put(state: State, words: list[str]) -> tuple[State, str]:
    item, place = _split(words, {"in", "on", "into", "onto", "inside"})
    if not item or not place:
        return state, "Put what where? Say: put <object> in/on <receptacle>."
    if state.where.get(item) != INVENTORY:
        return state, f"You are not carrying {'the ' + item if item in state.where else item}."
    receptacle = _here(state, place)
    if receptacle is None:
        return state, f"You see no {place} here."
    if not _visible(state, receptacle):
        return state, f"The {place} is closed."
    put = replace(state, where={**state.where, item: place})
    return put, f"You put the {item} {receptacle.preposition} the {place}."


def _open_or_close(opening: bool) -> Callable[[State, list[str]], tuple[State, str]]:
    def handler(state: State, words: list[str]) -> tuple[State, str]:
        name = " ".join(words)
        receptacle = _here(state, name)
        if receptacle is None:
            return state, f"You see no {name or 'such thing'} here."
        if not receptacle.openable:
            return state, f"The {name} does not open or close."
        if (name in state.opened) == opening:
            return state, f"The {name} is already {'open' if opening else 'closed'}."
        if not opening:
            return replace(state, opened=state.opened - {name}), f"You close the {name}."
        opened = replace(state, opened=state.opened | {name})
        items = ", ".join(_a(i, opened) for i in _contents(opened, receptacle)) or "nothing"
        return opened, f"You open the {name}. In it: {items}."

    return handler


def _clean(state: State, words: list[str]) -> tuple[State, str]:
    item, _ = _split(words, {"with", "in", "at", "under", "using"})
    if state.where.get(item) != INVENTORY:
        return state, f"You need to be holding the {item or 'object'} to clean it."
    sink = next((r for r in state.layout.receptacles if r.sink and r.room == state.room), None)
    if sink is None:
        return state, "There is nowhere to wash things here; find a sink."
    if item not in state.dirty:
        return state, f"The {item} is already clean."
    return replace(state, dirty=state.dirty - {item}), f"You wash the {item} in the {sink.name}."


_HANDLERS: dict[str, Callable[[State, list[str]], tuple[State, str]]] = {
    "look": lambda state, _: (state, _look(state)),
    "l": lambda state, _: (state, _look(state)),
    "go": _go,
    "walk": _go,
    "take": _take,
    "get": _take,
    "pick": lambda state, words: _take(state, words[1:] if words[:1] == ["up"] else words),
    "put": _put,
    "place": _put,
    "open": _open_or_close(True),
    "close": _open_or_close(False),
    "clean": _clean,
    "wash": _clean,
    "inventory": _inventory,
    "i": _inventory,
    "help": _help,
}
