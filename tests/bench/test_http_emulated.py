"""`bench http --emulate`: the dilated device, the wall-clock plan and the rows on the device's
clock, and the stock arm's command line on the emulated device."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from interlude.bench.http_emulated import Emulation, in_device_time
from interlude.loadgen.plan import conversations
from interlude.loadgen.sweep import RunSpec
from interlude.policy import load_profile


def test_a_dilated_profile_is_the_same_device_k_times_slower() -> None:
    p = load_profile("gptj-6b-a100-40g")
    d = p.dilated(4)
    assert d.name == "gptj-6b-a100-40g-x4"
    assert d.t_fwd(100) == pytest.approx(4 * p.t_fwd(100))
    assert d.t_swap(1000) == pytest.approx(4 * p.t_swap(1000))
    # What the policies compare (copy against compute) and the capacities stay as they were.
    assert d.swap_budget_tokens(64) == p.swap_budget_tokens(64)
    assert (d.gpu_blocks, d.cpu_blocks, d.max_num_seqs) == (p.gpu_blocks, p.cpu_blocks, 256)
    assert p.dilated(1) is p
    with pytest.raises(ValueError, match="dilation"):
        p.dilated(0.5)


def test_the_plan_on_the_wall_clock_is_the_device_plan_stretched() -> None:
    emu = Emulation("gptj-6b-a100-40g", 4)
    device = RunSpec("generated:mixed", (2.0, 4.0), 20.0, 50.0, 0, emu.scale())
    wall = emu.wall_spec(device)
    assert wall.rates == (0.5, 1.0) and wall.duration_s == 80.0 and wall.horizon == 200.0
    same = RunSpec("generated:mixed", (2.0,), 20.0, None, 0, Emulation("gptj-6b-a100-40g").scale())
    plain = conversations(same.workload, 2.0, same.duration_s, 0, same.scale)
    slow = conversations(wall.workload, 0.5, wall.duration_s, 0, wall.scale)
    # The same conversations, arriving 4x apart, their tools 4x slower, their tokens unscaled.
    assert [c.prompt_tokens for c in slow] == [c.prompt_tokens for c in plain]
    assert [c.arrival_s for c in slow] == pytest.approx([4 * c.arrival_s for c in plain])
    pairs = zip(slow, plain, strict=True)
    delays = [
        (a.delay_s, b.delay_s) for x, y in pairs for a, b in zip(x.steps, y.steps, strict=True)
    ]
    assert delays and all(a == pytest.approx(4 * b) for a, b in delays)


def test_rows_come_back_on_the_devices_clock() -> None:
    row = {"arm": "x", "rate": 0.5, "p99_norm_latency_s": 0.08, "ttft_mean_s": 2.0}
    row |= {"tokens_per_s": 100.0, "finished_per_s": 0.25, "unfinished": 3, "cpu_s": {"a": 1.0}}
    (out,) = in_device_time([row], 4)
    assert out["rate"] == 2.0 and out["p99_norm_latency_s"] == pytest.approx(0.02)
    assert out["ttft_mean_s"] == 0.5 and out["tokens_per_s"] == 400.0
    assert out["finished_per_s"] == 1.0
    # Counts and CPU seconds are what they were; the input row is left alone.
    assert out["unfinished"] == 3 and out["cpu_s"] == {"a": 1.0} and row["rate"] == 0.5


def test_a_bad_emulation_is_refused_early() -> None:
    with pytest.raises(ValueError, match="unknown profile"):
        Emulation("no-such-gpu")
    with pytest.raises(ValueError, match="dilation"):
        Emulation("gptj-6b-a100-40g", 0.0)


def test_the_parked_session_deadline_outlasts_the_longest_tool() -> None:
    from interlude.bench.http_bench import DEADLINE_MARGIN_S, client_deadline_s

    spec = Emulation("gptj-6b-a100-40g", 4).wall_spec(
        RunSpec("generated:mixed", (2.0,), 20.0, None, 0, Emulation("gptj-6b-a100-40g", 4).scale())
    )
    plan = conversations(spec.workload, spec.rates[0], spec.duration_s, 0, spec.scale)
    longest = max(s.delay_s for c in plan for s in c.steps)
    assert longest > 3.0  # unscaled tool times, dilated
    assert client_deadline_s(spec) == pytest.approx(DEADLINE_MARGIN_S + longest)


def test_both_arms_get_the_emulated_devices_capacity(tmp_path: Path) -> None:
    from interlude.bench.http_servers import stock_vllm_argv

    path, emu = Emulation("gptj-6b-a100-40g", 4).prepare(tmp_path)
    assert load_profile(path).fwd_c_ms == pytest.approx(40.0)
    config = (emu.model_dir / "config.json").read_text()
    assert '"fwd_c_ms": 40.0' in config  # the model holds passes to the dilated time
    batch = (emu.max_num_seqs, emu.max_num_batched_tokens)
    argv = stock_vllm_argv(str(emu.model_dir), 8000, True, emu.blocks, batch=batch)

    def flag(name: str) -> str:
        return argv[argv.index(name) + 1]

    assert flag("--num-gpu-blocks-override") == str(emu.blocks) == "1707"
    assert (flag("--max-num-seqs"), flag("--max-num-batched-tokens")) == ("256", "8192")


def test_the_default_horizon_lets_the_longest_conversation_finish() -> None:
    """On the trace's own tool times a 2 x duration horizon cuts the long conversations in
    every arm alike; the emulated bench's default waits for the one with the most tool time."""
    emu = Emulation("gptj-6b-a100-40g", 4)
    spec = RunSpec("generated:mixed", (2.0, 4.0), 20.0, None, 0, emu.scale())
    plan = conversations(spec.workload, 4.0, 20.0, 0, spec.scale)
    longest = max(sum(s.delay_s for s in c.steps) for c in plan) / 4  # on the device's clock
    horizon = emu.whole_horizon(spec)
    assert horizon >= 20.0 + 1.2 * longest > spec.horizon
    # The same on the wall: every tool call of the plan, dilated, ends before it.
    wall = emu.wall_spec(replace(spec, horizon_s=horizon))
    assert all(4 * c.arrival_s + sum(s.delay_s for s in c.steps) < wall.horizon for c in plan)


def test_a_given_slo_sets_every_rounds_limit_on_the_wall_clock_without_the_reference(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from contextlib import nullcontext
    from typing import Any

    from interlude.bench import http_bench

    limits: list[tuple[str, float | None, bool]] = []

    def run_rates(arm: str, _t: Any, spec: RunSpec, *a: Any, **kw: Any) -> list[dict[str, Any]]:
        _texts, run, slo, _progress, _settle, ref, _meters = a
        limits.append((arm, slo, ref))
        # 10 ms/token on the wall clock at dilation 4: 2.5 on the device's.
        ms = {"median_norm_latency_s": 0.010, "p99_norm_latency_s": 0.012}
        return [{"arm": arm, "rate": r, "run": run, "unfinished_fraction": 0.0} | ms
                for r in spec.rates]  # fmt: skip

    monkeypatch.setattr(http_bench, "run_rates", run_rates)
    monkeypatch.setattr(http_bench, "server", lambda *a: nullcontext("http://engine"))
    monkeypatch.setattr(http_bench, "_device", lambda *a: http_bench.Device("m", 40))
    emu = Emulation("gptj-6b-a100-40g", 4)
    spec = RunSpec("generated:mixed", (10.0, 14.0), 20.0, 60.0, 0, emu.scale())
    out = http_bench.run_http_bench(
        spec, ["vllm-prefix", "interlude"], 2, 40, tmp_path, None,  # type: ignore[arg-type]
        None, lambda _: None, emulation=emu, slo=0.003,
    )  # fmt: skip
    # 3 ms/token on the device's clock is 12 on the wall's; no arm takes its own.
    assert [(a, r) for a, _, r in limits] == 2 * [("vllm-prefix", False), ("interlude", False)]
    assert [s for _, s, _ in limits] == pytest.approx(4 * [0.012])
    rounds = out["verdict"]["rounds"]
    assert [r["slo_s_per_token"] for r in rounds] == [0.003, 0.003]
    assert rounds[0]["sustainable"]["interlude"]["median"] == 14.0
    assert out["meta"]["slo_given_s_per_token"] == 0.003


def test_a_time_scale_divides_the_tools_and_the_horizon_with_them() -> None:
    """`--time-scale 10` runs `bench sim-check`'s conversations: the same arrivals and
    tokens, every tool call 10x shorter on the device's clock, and a horizon that still lets
    the longest one finish (so the tail rule can be judged within minutes)."""
    whole, short = Emulation("gptj-6b-a100-40g", 4), Emulation("gptj-6b-a100-40g", 4, 10.0)
    a = RunSpec("shared", (8.0,), 20.0, None, 0, whole.scale())
    b = RunSpec("shared", (8.0,), 20.0, None, 0, short.scale())
    slow, fast = (conversations(s.workload, 2.0, 80.0, 0, s.scale) for s in (a, b))
    assert [c.prompt_tokens for c in fast] == [c.prompt_tokens for c in slow]
    assert [c.arrival_s for c in fast] == [c.arrival_s for c in slow]
    pairs = zip(fast, slow, strict=True)
    delays = [
        (x.delay_s, y.delay_s) for c, d in pairs for x, y in zip(c.steps, d.steps, strict=True)
    ]
    assert delays and all(x == pytest.approx(y / 10) for x, y in delays)
    assert 20.0 < short.whole_horizon(b) < whole.whole_horizon(a) / 5
    with pytest.raises(ValueError, match="time_scale"):
        Emulation("gptj-6b-a100-40g", 4, 0.0)
