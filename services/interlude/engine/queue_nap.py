"""vLLM's processes nap, instead of spinning, while they wait on their shared-memory queues.

vLLM's multiprocess executor (which its CPU build always uses) passes each step between the
engine core and its worker through a shared-memory queue. After every read the reader polls
for the next message with `sched_yield` for a hard-coded second (`SpinCondition.busy_loop_s`)
before it sleeps on a ZeroMQ notification. Steps come every few milliseconds, so under load
the engine core and the worker spin from the first token to the last, and for a second after.
On a GPU server that costs one idle core each. On a CPU engine it costs the cores that do the
work: the engine core's spin takes half the core the API front end and the gateway run on,
and a worker that served last keeps spinning beside another engine's forward pass (vLLM issue
19036; PRs 52814 and 52848 would make it configurable upstream, 0.32 has no setting).

Shortening the window is not enough: a reader that parks on the notification can miss it
(ZeroMQ drops a publish past its high-water mark of 1) and then sleeps until vLLM's 5 s
recheck; with a 2 ms window we saw one answer in ten take 5 s. So the window stays and the
reader naps between polls: `time.sleep(nap)` in place of `sched_yield`. It sees a new message
at most one nap late and leaves the core to others meanwhile.

`register` is a vLLM general plugin (run in every vLLM process: front end, engine core,
workers) that makes readers nap `INTERLUDE_VLLM_QUEUE_NAP_S` seconds. Unset or negative, it
changes nothing. Where vLLM's CPU build is installed, an Interlude engine sets it to 0.1 ms
(`engine.config.prepare_process_env`), and so does the stock vLLM arm our benchmarks start,
so both arms run on the same queue; on GPU servers it is for the operator to set.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from interlude.env import load_env

_MARK = "_interlude_nap_s"
log = logging.getLogger(__name__)


def register() -> None:
    """vLLM's plugin hook: readers nap between polls (no-op unless the variable is set).

    It runs in every vLLM process of this environment, stock `vllm serve` too: a bad
    `INTERLUDE_*` value is logged and the queues keep vLLM's spin, rather than stopping vLLM."""
    try:
        nap_s = load_env().vllm_queue_nap_s
    except ValueError as exc:
        log.warning("vLLM's queues keep their spin: %s", exc)
        return
    if nap_s >= 0:
        from vllm.distributed.device_communicators import shm_broadcast

        nap_between_polls(shm_broadcast.SpinCondition, nap_s)


def nap_between_polls(cls: Any, nap_s: float) -> None:
    """Make readers of `cls` (vLLM's `SpinCondition`) sleep `nap_s` seconds per poll while in
    their busy window, instead of yielding; outside it, vLLM's own wait (the notification).
    Acts on readers made before this call too (a worker builds its queues before it loads
    plugins): the change is to the class's `wait`, which every reader calls per poll."""
    wait: Callable[..., None] = cls.wait
    original = getattr(wait, "__wrapped__", wait)

    def napping(self: Any, timeout_ms: int | None = None) -> None:
        if time.monotonic() <= self.last_read + self.busy_loop_s:
            time.sleep(nap_s)
        else:
            original(self, timeout_ms)

    napping.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(napping, _MARK, nap_s)
    cls.wait = napping


def queue_nap(cls: Any) -> float | None:
    """The nap `nap_between_polls` gave `cls`, or None if it has none."""
    value = getattr(cls.wait, _MARK, None)
    return None if value is None else float(value)
