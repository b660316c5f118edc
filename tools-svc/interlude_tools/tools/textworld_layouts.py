"""The houses the "textworld" game is played in: rooms, receptacles, objects and a task each.

Data, apart from the rules (`interlude_tools.tools.textworld_game`): a new layout is one more
entry in `LAYOUTS`, checked when the module loads (`Layout.__post_init__`), with no rule to
change. A game's seed picks one, `LAYOUTS[game % len(LAYOUTS)]`, so a seed always gives the same
house.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Receptacle:
    """A place objects are in or on; names are one word, unique within a layout."""

    name: str
    room: str
    preposition: str = "on"  # how it is described: "in" a cabinet, "on" a table
    openable: bool = False  # starts closed, its contents hidden until opened
    sink: bool = False  # objects held in its room can be cleaned


@dataclass(frozen=True)
class Layout:
    """One game: the house, where everything starts, and the task."""

    start: str  # the room the player starts in
    exits: Mapping[str, Mapping[str, str]]  # room -> direction -> room
    receptacles: tuple[Receptacle, ...]
    objects: Mapping[str, str]  # object -> the receptacle it starts in
    dirty: frozenset[str]  # objects that start dirty
    goal: tuple[str, str]  # (object, receptacle): the object must end there, clean

    def __post_init__(self) -> None:
        """ValueError for a layout that could not be played: a typo, not a player's mistake."""
        names = [r.name for r in self.receptacles]
        rooms = set(self.exits)
        targets = {room for ways in self.exits.values() for room in ways.values()}
        if len(set(names)) != len(names) or set(names) & set(self.objects):
            raise ValueError(f"receptacle and object names must be unique: {names}")
        if self.start not in rooms or not targets <= rooms:
            raise ValueError(f"exits lead to rooms that are not in the layout: {targets - rooms}")
        if any(r.room not in rooms for r in self.receptacles):
            raise ValueError("every receptacle must be in a room of the layout")
        if not set(self.objects.values()) <= set(names) or self.goal[1] not in names:
            raise ValueError("objects and the goal must be in receptacles of the layout")
        if self.goal[0] not in self.objects:
            raise ValueError(f"the goal's object {self.goal[0]!r} is not in the layout")

    def receptacle(self, name: str) -> Receptacle | None:
        return next((r for r in self.receptacles if r.name == name), None)

    @property
    def task(self) -> str:
        item, place = self.goal
        preposition = next(r.preposition for r in self.receptacles if r.name == place)
        return f"put a clean {item} {preposition} the {place}"


LAYOUTS = (
    Layout(
        start="kitchen",
        exits={"kitchen": {"north": "dining room"}, "dining room": {"south": "kitchen"}},
        receptacles=(
            Receptacle("cabinet", "kitchen", "in", openable=True),
            Receptacle("counter", "kitchen"),
            Receptacle("sink", "kitchen", "in", sink=True),
            Receptacle("table", "dining room"),
            Receptacle("shelf", "dining room"),
        ),
        objects={"mug": "cabinet", "plate": "counter", "apple": "table", "vase": "shelf"},
        dirty=frozenset({"mug", "plate"}),
        goal=("mug", "table"),
    ),
    Layout(
        start="bedroom",
        exits={
            "bedroom": {"east": "hallway"},
            "hallway": {"west": "bedroom", "south": "bathroom"},
            "bathroom": {"north": "hallway"},
        },
        receptacles=(
            Receptacle("bed", "bedroom"),
            Receptacle("drawer", "bedroom", "in", openable=True),
            Receptacle("shelf", "hallway"),
            Receptacle("basin", "bathroom", "in", sink=True),
            Receptacle("bathtub", "bathroom", "in"),
        ),
        objects={"cloth": "drawer", "book": "bed", "candle": "shelf", "sponge": "bathtub"},
        dirty=frozenset({"cloth"}),
        goal=("cloth", "shelf"),
    ),
    Layout(
        start="garden",
        exits={"garden": {"east": "kitchen"}, "kitchen": {"west": "garden"}},
        receptacles=(
            Receptacle("basket", "garden", "in"),
            Receptacle("bench", "garden"),
            Receptacle("fridge", "kitchen", "in", openable=True),
            Receptacle("sink", "kitchen", "in", sink=True),
            Receptacle("counter", "kitchen"),
        ),
        objects={"apple": "basket", "trowel": "bench", "bottle": "fridge", "knife": "counter"},
        dirty=frozenset({"apple", "trowel"}),
        goal=("apple", "fridge"),
    ),
)
