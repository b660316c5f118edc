"""`bench http --emulate PROFILE`: the HTTP comparison on an emulated accelerator.

Every arm serves the tiny model on the same emulated device (`engine/emulate.py`): stock vLLM's
OpenAI server loads the emulated model directory through the plugin, with the profile's KV
blocks and batch limits; the Interlude engine takes the same profile (`--emulate`). The
workload is the trace at its own scale: its token counts, and its tool times unless
`time_scale` divides them (as `bench sim-check` does, so runs end within minutes).

A GPU host gives the serving path many cores; this machine has two, and at a GPU's token rate
the HTTP layers of either arm would need more CPU than it has. `dilation` k runs the device k
times slower (`Profile.dilated`) and multiplies tool times and arrival gaps by k: the same
schedule in k times the wall time, with the serving path's CPU weighing k times less (a host
CPU k times faster). Rows are reported in the device's own time (`in_device_time`): rates and
throughputs times k, latencies divided by k.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from interlude.engine.emulate import Emulated, emulated
from interlude.loadgen.plan import Scale
from interlude.loadgen.sweep import RunSpec, planned
from interlude.policy import Profile, load_profile

# Row fields in seconds of the run's clock, and per second of it (the rest are counts, CPU
# seconds or ratios, which dilation leaves as they are).
_SECONDS = (
    "makespan_s",
    "median_norm_latency_s",
    "p90_norm_latency_s",
    "p99_norm_latency_s",
    "ttft_mean_s",
    "ttft_p99_s",
    "e2e_mean_s",
    "e2e_p99_s",
    "resume_wait_mean_s",
    "resume_wait_p99_s",
)
_PER_SECOND = ("finished_per_s", "tokens_per_s")


@dataclass(frozen=True)
class Emulation:
    """The emulated device every arm runs on: a profile (a shipped name or a JSON path), run
    `dilation` times slower. `time_scale` divides the trace's tool times on the device's
    clock (1: the trace as it is); `bench sim-check` divides them by 10 so that every
    conversation ends within minutes, and the tail rule can be judged in a run that short."""

    profile: str
    dilation: float = 1.0
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        self.device_profile()  # a clear ValueError, early
        if self.time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")

    def device_profile(self) -> Profile:
        """The profile every arm's device runs: the named one, `dilation` times slower."""
        return load_profile(self.profile).dilated(self.dilation)

    def prepare(self, out: Path) -> tuple[str, Emulated]:
        """Write the dilated profile's JSON into `out`; its path (what `interlude engine
        --emulate` takes) and the emulated device (model directory, capacities)."""
        profile = self.device_profile()
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{profile.name}.json"
        path.write_text(profile.to_json())
        return str(path), emulated(str(path))

    def scale(self) -> Scale:
        """The trace's tokens as they are, its tool times divided by `time_scale` and
        dilated with the device."""
        return Scale(time_scale=self.time_scale / self.dilation)

    def whole_horizon(self, spec: RunSpec, margin: float = 1.2) -> float:
        """A horizon (device clock) that lets every conversation of `spec` (given on the device's
        clock, its scale `scale()`) finish when the server keeps up: the duration plus `margin`
        x the most tool time a conversation spends. On the trace's own times a few
        conversations wait minutes on their tools; cut at a shorter horizon they are the p99 of
        every arm alike (docs/emulation.md)."""
        tool_s = (sum(step.delay_s for step in conv.steps) for conv in planned(spec))
        longest = max(tool_s, default=0.0) / self.dilation
        return spec.duration_s + margin * longest

    def wall_spec(self, spec: RunSpec) -> RunSpec:
        """`spec`'s rates, duration and horizon, given on the device's clock, on the wall's."""
        k = self.dilation
        return replace(
            spec,
            rates=tuple(r / k for r in spec.rates),
            duration_s=spec.duration_s * k,
            horizon_s=spec.horizon * k,
        )


def in_device_time(rows: Iterable[dict[str, Any]], dilation: float) -> list[dict[str, Any]]:
    """`rows` measured on the wall clock, in the emulated device's time."""
    out = []
    for row in rows:
        r = dict(row)
        r["rate"] = row["rate"] * dilation
        for key in _SECONDS:
            if key in r:
                r[key] = r[key] / dilation
        for key in _PER_SECOND:
            if key in r:
                r[key] = r[key] * dilation
        if "resume_start" in r:
            r["resume_start"] = {
                via: _device_start(s, dilation) for via, s in r["resume_start"].items()
            }
        out.append(r)
    return out


def _device_start(start: dict[str, Any], dilation: float) -> dict[str, Any]:
    """A `resume_start` summary on the device's clock; the share within 5 ms was counted on
    the wall's, so it says nothing there once dilated."""
    p50 = start["p50_ms"]
    within = start["within_5ms"] if dilation == 1.0 else None
    return start | {"p50_ms": None if p50 is None else p50 / dilation, "within_5ms": within}


def emulation_meta(emulation: Emulation, device: Emulated) -> dict[str, Any]:
    return {
        "profile": emulation.profile,
        "dilation": emulation.dilation,
        "time_scale": emulation.time_scale,
        "blocks": device.blocks,
        "host_blocks": device.host_blocks,
        "max_num_seqs": device.max_num_seqs,
        "max_num_batched_tokens": device.max_num_batched_tokens,
        "times": "rows on the emulated device's clock (wall-clock seconds / dilation); "
        "rates, duration_s and horizon_s above on the wall's",
    }
