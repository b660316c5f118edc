"""Engines named in a file: the roster a local pool controller rewrites as it scales.

`interlude up --min-engines` starts engines and drains them as the operator's rule decides
(`stack/pool.py`), on one machine with no Kubernetes API to list them; it writes the roster
here instead, as JSON: `{"engines": [URL, ...], "draining": [URL, ...]}`. The gateway reads it
on every pool poll, so an engine joins the pool within a poll of starting, and one being drained
gets no new session but keeps its paused ones, as with `EndpointSliceDiscovery`'s labels.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def render_roster(engines: list[str], draining: list[str]) -> str:
    """The file's text for `engines`, of which `draining` get no new session."""
    unknown = sorted(set(draining) - set(engines))
    if unknown:
        raise ValueError(f"draining engines must be engines too: {unknown}")
    return json.dumps({"engines": engines, "draining": draining})


def parse_roster(text: str) -> tuple[list[str], frozenset[str]]:
    """(engines, draining) from the file's text; ValueError naming what is wrong."""
    doc: Any = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("the roster must be a JSON object")
    engines, draining = doc.get("engines", []), doc.get("draining", [])
    for name, urls in (("engines", engines), ("draining", draining)):
        if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
            raise ValueError(f"roster {name!r} must be a list of URLs")
        bad = [u for u in urls if not u.startswith(("http://", "https://"))]
        if bad:
            raise ValueError(f"roster {name!r}: URLs must start with http:// or https://: {bad}")
    return list(engines), frozenset(draining) & frozenset(engines)


def write_roster(path: Path, engines: list[str], draining: list[str]) -> None:
    """Replace the roster at `path` at once (a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render_roster(engines, draining))
    tmp.replace(path)


class FileDiscovery:
    """`urls()`: the engines the roster file names (and `extra`, static URLs beside them).

    Side effects: reads the file on every `urls()`. A missing or unreadable file keeps the
    last roster read (a pool controller that stops does not empty the gateway's pool), and is
    logged once per distinct problem. Invariant: `draining()` is a subset of the last `urls()`.
    """

    def __init__(self, path: str, extra: tuple[str, ...] = ()) -> None:
        self.path = Path(path)
        self.extra = extra
        self._engines: list[str] = []
        self._draining: frozenset[str] = frozenset()
        self._problem = ""

    async def urls(self) -> list[str]:
        try:
            self._engines, self._draining = parse_roster(self.path.read_text())
            self._problem = ""
        except (OSError, ValueError) as exc:
            if str(exc) != self._problem:
                self._problem = str(exc)
                log.warning("engine roster %s unreadable, keeping the last one: %s", self.path, exc)
        return sorted(set(self._engines) | set(self.extra))

    def draining(self) -> frozenset[str]:
        return self._draining
