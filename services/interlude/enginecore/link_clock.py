"""Where the worker's swap copies meet an emulated accelerator's clock (`engine/emulate.py`).

On a GPU a copy over the host link takes its bytes over the link's bandwidth; on the emulated
device the tiny model's copies take microseconds, so the connector reports each step's copies
here and the emulated forward pass lasts as the simulator's iteration does: a budgeted step
as long as its compute or its copies, whichever is longer (they overlap), a synchronous copy on
top (the batch waits for it). Without an emulated model nothing is installed and a report costs
one comparison.

One clock per worker process (vLLM runs one model there); installed by the emulated model when
it is built, read by `HostSwapConnector.start_load_kv`, which runs in the same process before
that step's forward pass.
"""

from __future__ import annotations

from typing import Protocol


class LinkClock(Protocol):
    """Takes a step's copies over the emulated host link.

    `copied` is called before the step's forward pass, with the tokens copied in both
    directions; `stalls` says the batch waits for them (a SYNC-mode policy) rather than
    computing beside them. Side effects: the clock's next forward pass lasts longer; nothing
    else. It must not block.
    """

    def copied(self, tokens: int, stalls: bool) -> None: ...


_clock: LinkClock | None = None


def install(clock: LinkClock | None) -> None:
    """Make `clock` the one this process's copies report to (None: none does)."""
    global _clock
    _clock = clock


def report_copies(tokens: int, stalls: bool) -> None:
    """A step copies `tokens` tokens of KV over the host link (both directions together)."""
    if _clock is not None and tokens > 0:
        _clock.copied(tokens, stalls)
