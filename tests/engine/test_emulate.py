"""The emulated accelerator (`engine/emulate.py`): a forward pass is held to the profile's
T_fwd, the model directory carries the profile, and a real engine on it runs no faster than the
profile's GPU and plans with its KV bytes (vLLM loads the model through its plugin entry point,
in its own processes)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from interlude.engine.emulate import (
    ARCHITECTURE,
    ForwardClock,
    emulated_model_dir,
    profile_blocks,
)
from interlude.policy import load_profile
from interlude.policy.profile import EMULATE_KEY


def test_a_pass_is_held_to_its_time_and_an_overrun_is_counted() -> None:
    clock = ForwardClock(fwd_a_ms=0.1, fwd_c_ms=20.0)  # T_fwd(100) = 30 ms
    started = time.perf_counter()
    clock.hold(started, 100)  # computed in no time: waits out the 30 ms
    assert time.perf_counter() - started >= 0.030
    assert (clock.steps, clock.overruns, clock.largest_on_time) == (1, 0, 100)
    started = time.perf_counter()
    time.sleep(0.050)  # a pass whose compute took longer than T_fwd(1) = 20.1 ms
    clock.hold(started, 1)
    assert (clock.overruns, clock.smallest_overrun) == (1, 1)
    assert "2 passes, 1 past their emulated time" in clock.report()


def test_the_work_between_passes_is_part_of_the_step() -> None:
    # T_fwd is a whole iteration: a pass that follows the last one closely ends T_fwd after
    # it, not T_fwd after its own start; after an idle gap it counts from its start.
    clock = ForwardClock(fwd_a_ms=0.0, fwd_c_ms=40.0)
    clock.hold(time.perf_counter(), 1)
    first_end = clock.last_end
    assert first_end is not None
    time.sleep(0.010)  # scheduling and sampling between the passes
    clock.hold(time.perf_counter(), 1)
    assert clock.last_end is not None and 0.040 <= clock.last_end - first_end < 0.048
    time.sleep(0.060)  # idle: longer than a pass
    started = time.perf_counter()
    clock.hold(started, 1)
    assert clock.last_end is not None and clock.last_end - started >= 0.040


def test_a_step_s_copies_take_the_host_link_s_time() -> None:
    # 1 MB a token over 1 GB/s: 1 ms a token. T_fwd of any pass: 20 ms.
    clock = ForwardClock(
        fwd_a_ms=0.0, fwd_c_ms=20.0, kv_bytes_per_token=10**6, swap_bandwidth_bps=1e9
    )

    def pass_s(copies: list[tuple[int, bool]]) -> float:
        for tokens, stalls in copies:
            clock.copied(tokens, stalls)
        time.sleep(0.1)  # idle: the pass counts from its start
        started = time.perf_counter()
        clock.hold(started, 1)
        assert clock.last_end is not None
        return clock.last_end - started

    assert 0.020 <= pass_s([(10, False)]) < 0.030  # 10 ms of copies hide behind the compute
    assert 0.040 <= pass_s([(25, False), (15, False)]) < 0.050  # 40 ms outlast it
    assert clock.link_bound == 1
    assert 0.030 <= pass_s([(10, True)]) < 0.040  # a synchronous copy: the batch waits
    assert clock.stalled_s == pytest.approx(0.010)
    assert 0.020 <= pass_s([]) < 0.030  # the copies were the last step's only
    assert "1 as long as their copies" in clock.report()
    free = ForwardClock(fwd_a_ms=0.0, fwd_c_ms=20.0)  # no bandwidth: copies take no time
    free.copied(10**6, True)
    started = time.perf_counter()
    free.hold(started, 1)
    assert free.last_end is not None and free.last_end - started < 0.028


def test_the_model_directory_names_the_architecture_and_carries_the_profile(
    tiny_model: str, tmp_path: Path
) -> None:
    profile = load_profile("gptj-6b-a100-40g")
    out = emulated_model_dir(Path(tiny_model), profile, tmp_path)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURE]
    assert config[EMULATE_KEY] == {
        "profile": profile.name,
        "fwd_a_ms": 0.0463,
        "fwd_c_ms": 10.0,
        "kv_bytes_per_token": profile.kv_bytes_per_token,
        "swap_bandwidth_bps": profile.swap_bandwidth_bps,
    }
    assert (out / "model.safetensors").resolve().parent == Path(tiny_model).resolve()
    assert emulated_model_dir(Path(tiny_model), profile, tmp_path) == out  # reused
    # The profile's 25 GB of KV at 458,752 bytes a token, in blocks of 32, plus vLLM's null one.
    assert profile_blocks(profile, 32) == 25054705664 // 458752 // 32 + 1


@pytest.mark.engine
def test_an_emulated_engine_runs_no_faster_than_the_profile(
    tiny_model: str, tmp_path: Path
) -> None:
    from interlude.bench.scripted import ScriptedSession, Step
    from interlude.bench.scripted_engine import ScriptedEngine
    from interlude.engine.config import EngineConfig

    profile = load_profile("gptj-6b-a100-40g")
    model = emulated_model_dir(Path(tiny_model), profile, tmp_path)
    session = ScriptedSession("s", tuple(10 + i % 300 for i in range(100)), (Step(24),))
    blocks = 200  # the profile's 1,708 would do; fewer keep the test's memory small
    engine = ScriptedEngine(
        EngineConfig(model=str(model), profile=profile.name, num_gpu_blocks=blocks)
    )

    async def body() -> tuple[Any, dict[str, Any]]:
        result = await engine.run_scripted(session)
        await asyncio.sleep(0.3)
        return result, engine.stats()

    try:
        result, stats = asyncio.run(body())
    finally:
        engine.shutdown()
    assert result.ok and len(result.turns[0]) == 24
    # The tiny model computes a token in a few ms on this CPU; the emulated A100 takes 10 ms
    # (vLLM found the emulated architecture through the plugin, in its engine-core process).
    # The clock holds the engine's passes; this loop sees them through its own event loop, so
    # the first token may reach it late (a CI run saw 5.5 ms): one pass of slack for that.
    assert result.end - result.first_token >= 22 * profile.t_fwd(1)
    assert stats["total_gpu_blocks"] == blocks
    # Its scheduler weighs a token of KV as the emulated device's model does, not the tiny
    # model's 2 KiB: the KV the policy plans with (and the swap budget) is the profile's.
    device_gb = blocks * 32 * profile.kv_bytes_per_token / 1e9
    assert stats["gpu_kv_gb"] == pytest.approx(device_gb, rel=1e-6)
