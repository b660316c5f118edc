"""Grafana dashboards as code: the JSON the Helm chart ships, generated from Python.

`python -m interlude.dashboards` (`make dashboards`) writes one file per dashboard into
charts/interlude/dashboards/; `--check` only compares, for CI and the chart tests, so the
committed JSON is always what this code makes and nobody edits it by hand. Built with Grafana's
grafana-foundation-sdk (a dev dependency: the chart ships the JSON, not this code).

Modules: `kit` (panels, queries, variables, trace links), `overview` and `scaling` (the
dashboards), `__main__` (the command).
"""

from __future__ import annotations

from collections.abc import Callable

from interlude.dashboards.kit import Board
from interlude.dashboards.overview import overview
from interlude.dashboards.scaling import scaling

# File name (in charts/interlude/dashboards/) -> the function that builds it.
DASHBOARDS: dict[str, Callable[[], Board]] = {
    "interlude-overview.json": overview,
    "interlude-scaling.json": scaling,
}


def render() -> dict[str, str]:
    """Every dashboard's JSON text, by file name (deterministic: sorted keys, fixed ids)."""
    return {name: build().json() for name, build in DASHBOARDS.items()}
