"""How an engine's load is measured and read (interlude.api.load): a counter's recent rate
(the busy share, the contended waste) and the placement score."""

from __future__ import annotations

import pytest

from interlude.api.load import RecentRate, placement_score


def test_a_recent_rate_follows_the_counter_over_its_window_and_falls_when_it_stops() -> None:
    busy = RecentRate(window_s=30.0)
    assert busy.update(0.0, now=0.0) == 0.0  # one sample: no rate yet
    assert busy.update(5.0, now=10.0) == pytest.approx(0.5)  # busy half of 10 s
    assert busy.update(15.0, now=20.0) == pytest.approx(0.75)
    # Idle from then on: the share falls as the busy samples leave the window.
    assert busy.update(15.0, now=40.0) == pytest.approx(10.0 / 30.0)
    assert busy.update(15.0, now=80.0) == 0.0
    waste = RecentRate()
    waste.update(0.0, scale=10.0, now=0.0)
    assert waste.update(20.0, scale=10.0, now=4.0) == pytest.approx(0.5)  # per GB of pool


def test_the_placement_score_adds_memory_waste_and_queue_per_slot() -> None:
    assert placement_score(0.5, 0.1, 32.0, 64.0) == pytest.approx(1.1)
    assert placement_score(0.0, 0.0, 3.0, 0.0) == 3.0  # no slots reported: per one
