"""Stop strings, applied by the chat route: vLLM rejects them on streaming-input sessions.

The scanner holds back the last `longest - 1` characters of what it was fed, since they may be
the start of a stop string, and cuts the text before the first stop string that appears.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopScanner:
    """Text in, text safe to show out; `stopped` once a stop string was seen."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        self.pending += text
        cut = min((i for s in self.stops if (i := self.pending.find(s)) >= 0), default=-1)
        if cut >= 0:
            shown, self.pending, self.stopped = self.pending[:cut], "", True
            return shown
        keep = len(self.pending) - self.hold
        if keep <= 0:
            return ""
        shown, self.pending = self.pending[:keep], self.pending[keep:]
        return shown

    def flush(self) -> str:
        """What is held back, when the text ended without a stop string."""
        shown, self.pending = self.pending, ""
        return "" if self.stopped else shown
