"""vLLM's queue readers nap instead of spinning (`interlude.engine.queue_nap`), on vLLM's real
`SpinCondition` with real ZeroMQ sockets: what its `wait` does per poll, inside its busy window
and after it, and that the plugin acts only where the variable asks it to."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
import zmq
from vllm.distributed.device_communicators import shm_broadcast

from interlude.engine import queue_nap
from interlude.engine.config import QUEUE_NAP_S, prepare_process_env

# vLLM's own `wait`, whether or not an engine started earlier in this test process has
# loaded the plugin already (vLLM loads general plugins once per process).
VLLM_WAIT = getattr(
    shm_broadcast.SpinCondition.wait, "__wrapped__", shm_broadcast.SpinCondition.wait
)


@pytest.fixture(autouse=True)
def vllms_own_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shm_broadcast.SpinCondition, "wait", VLLM_WAIT)


@pytest.fixture
def reader(tmp_path: Path) -> Iterator[Any]:
    """A reader `SpinCondition` (of a subclass, so the patch stays off vLLM's own class) and
    its writer, on an ipc socket of this test's own."""

    class Probe(shm_broadcast.SpinCondition):  # type: ignore[misc]
        wait = VLLM_WAIT

    ctx = zmq.Context()
    address = f"ipc://{tmp_path}/notify"
    writer = shm_broadcast.SpinCondition(is_reader=False, context=ctx, notify_address=address)
    probe = Probe(is_reader=True, context=ctx, notify_address=address)
    try:
        yield probe
    finally:
        for s in (probe.local_notify_socket, probe.read_cancel_socket, probe.write_cancel_socket):
            s.close(linger=0)
        writer.local_notify_socket.close(linger=0)
        ctx.term()


def count_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[float]]:
    calls: dict[str, list[float]] = {"yield": [], "sleep": []}
    monkeypatch.setattr(shm_broadcast, "sched_yield", lambda: calls["yield"].append(0.0))
    real_sleep = time.sleep
    monkeypatch.setattr(
        queue_nap.time, "sleep", lambda s: (calls["sleep"].append(s), real_sleep(s))
    )
    return calls


def test_vllms_reader_spins_in_its_busy_window(
    reader: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the plugin replaces: vLLM yields the core and returns at once, poll after poll."""
    calls = count_calls(monkeypatch)
    reader.record_read()
    for _ in range(100):
        reader.wait(timeout_ms=10)
    assert len(calls["yield"]) == 100 and not calls["sleep"]


def test_a_napping_reader_sleeps_each_poll_and_still_parks_when_idle(
    reader: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = count_calls(monkeypatch)
    queue_nap.nap_between_polls(type(reader), 0.0002)
    assert queue_nap.queue_nap(type(reader)) == 0.0002
    assert queue_nap.queue_nap(shm_broadcast.SpinCondition) is None  # vLLM's class untouched
    reader.record_read()
    for _ in range(20):
        reader.wait(timeout_ms=10)
    assert calls["sleep"] == [0.0002] * 20 and not calls["yield"]
    # Past the busy window, vLLM's own wait: parked on the notification socket until the
    # timeout (nothing was written), no nap.
    reader.last_read = time.monotonic() - 2 * reader.busy_loop_s
    started = time.monotonic()
    reader.wait(timeout_ms=50)
    assert time.monotonic() - started >= 0.04
    assert len(calls["sleep"]) == 20
    # Applied twice, the nap replaces the nap (it does not wrap it).
    queue_nap.nap_between_polls(type(reader), 0.0001)
    reader.record_read()
    reader.wait(timeout_ms=10)
    assert calls["sleep"][-1] == 0.0001 and len(calls["sleep"]) == 21


def test_the_plugin_acts_only_where_the_variable_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = shm_broadcast.SpinCondition  # vLLM's own `wait` here, restored after (autouse)
    monkeypatch.delenv("INTERLUDE_VLLM_QUEUE_NAP_S", raising=False)
    queue_nap.register()
    assert queue_nap.queue_nap(cls) is None
    # A bad value (here, one that would stall every step) leaves vLLM's spin, and vLLM runs.
    for bad in ("inf", "nan", "2", "soon"):
        monkeypatch.setenv("INTERLUDE_VLLM_QUEUE_NAP_S", bad)
        queue_nap.register()
        assert queue_nap.queue_nap(cls) is None, bad
    monkeypatch.setenv("INTERLUDE_VLLM_QUEUE_NAP_S", "0.0003")
    queue_nap.register()
    assert queue_nap.queue_nap(cls) == 0.0003


def test_vllm_finds_the_plugin_and_engines_turn_it_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    plugins = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert plugins.get("interlude_queue_nap") == "interlude.engine.queue_nap:register"
    # A copy of the environment: what prepare_process_env sets does not outlive the test.
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items()})
    os.environ.pop("INTERLUDE_VLLM_QUEUE_NAP_S", None)
    prepare_process_env(str(tmp_path))
    assert os.environ["INTERLUDE_VLLM_QUEUE_NAP_S"] == QUEUE_NAP_S


def test_a_quiet_process_has_vllm_log_errors_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items()})
    os.environ.pop("VLLM_LOGGING_LEVEL", None)
    prepare_process_env(str(tmp_path))
    assert "VLLM_LOGGING_LEVEL" not in os.environ  # engines log as vLLM does
    prepare_process_env(str(tmp_path), quiet=True)
    assert os.environ["VLLM_LOGGING_LEVEL"] == "ERROR"
