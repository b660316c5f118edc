"""The parking lot's bounded records: resumed turns' starts kept for the stats, and tool-name
counters (Prometheus labels) capped, whatever names models and scripts bring."""

from __future__ import annotations

from interlude.enginecore.parking import MAX_TOOL_LABELS, MAX_TURN_STARTS, Parked, ParkingLot


def test_turn_starts_are_kept_for_the_stats_and_bounded() -> None:
    lot = ParkingLot(32, 1024)
    lot.resumed_at = {"a": 10.0, "b": 10.5}
    lot.count_waits({"a": 5, "b": 7}, {"b": "swap"}, now=11.0)
    assert lot.turn_starts == {"a": ("preserve", 1.0), "b": ("swap", 0.5)}
    lot.resumed_at = {f"r{i}": 0.0 for i in range(MAX_TURN_STARTS + 5)}
    lot.count_waits(dict.fromkeys(lot.resumed_at, 1), {}, now=1.0)
    assert len(lot.turn_starts) == MAX_TURN_STARTS and "a" not in lot.turn_starts


def test_tool_names_past_the_label_cap_count_as_other() -> None:
    lot = ParkingLot(32, 1024)
    for i in range(MAX_TOOL_LABELS + 10):
        lot.park(Parked(f"r{i}", "k", 0.0, 0.0, f"tool{i}", 0, 0, 1))
    lot.park(Parked("again", "k", 0.0, 0.0, "tool0", 0, 0, 1))
    counts = lot.counters.interceptions
    assert len(counts) == MAX_TOOL_LABELS + 1 and counts["other"] == 10 and counts["tool0"] == 2
