"""An emulated accelerator: vLLM's real scheduler and KV cache manager on the CPU build, with a
forward pass that takes a GPU profile's time.

The model is the tiny random-weight Llama (`tiny_model.py`) under another architecture name,
`InterludeEmulatedLlamaForCausalLM`: each forward pass computes the tiny model, then waits out
the rest of the profile's T_fwd(n) = a x n + c for the step's n tokens (`ForwardClock`). Waiting,
not computing, leaves the CPU to the serving path, as a GPU host leaves it; a step whose real
compute already took longer than T_fwd is counted as an overrun (the emulation is then slower
than the GPU it stands for, and says so in the log). The step's swap copies take the profile's
host link: the pass lasts as long as its budgeted copies when they outlast T_fwd, and a
SYNC-mode policy's copies are added to it (`enginecore/link_clock.py`), as in the simulator.

It reaches vLLM as a model plugin: `register` is an entry point in vLLM's `vllm.general_plugins`
group (pyproject.toml), which every vLLM process runs, so stock `vllm serve` loads the same
emulated model as `interlude engine` and both arms of a benchmark run on identical emulated
hardware. The profile's numbers travel in the model directory's `config.json`
(`interlude_emulate`, written by `emulated_model_dir`), the only input of the emulation.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from interlude.enginecore import link_clock
from interlude.policy import Profile
from interlude.policy.profile import EMULATE_KEY

# Under vLLM's logger: the model runs in vLLM's worker process, where only "vllm.*" loggers have
# a handler (ours would print nothing below a warning).
log = logging.getLogger("vllm.interlude.emulate")

ARCHITECTURE = "InterludeEmulatedLlamaForCausalLM"
# How often the model says how the emulation holds up (wall-clock seconds).
REPORT_EVERY_S = 30.0


def register() -> None:
    """vLLM's plugin hook: make the emulated architecture loadable (by name, lazily: this runs in
    every vLLM process, and importing the model there is vLLM's business)."""
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, f"{__name__}:EmulatedLlamaForCausalLM")


@dataclass
class ForwardClock:
    """Holds each forward pass to T_fwd(n) = a x n + c milliseconds, and to the host link's time
    for the step's swap copies (`copied`, through `enginecore.link_clock`).

    A step's pass lasts max(T_fwd(n), T_link(budgeted copies)) + T_link(synchronous copies),
    T_link(m) = m x `kv_bytes_per_token` / `swap_bandwidth_bps`: the simulator's iteration
    (`sim/simulator.py`), where budgeted copies overlap the compute and a SYNC policy's stall
    the batch. With no bandwidth (0) copies take no time. The copies of a step with no
    forward pass (vLLM runs none when it scheduled no token) go to the next pass's time: the
    simulator's copy-only iteration, one pass late.

    Side effects: sleeps. Invariant: a pass ends no earlier than that after the last one ended
    (or after it started, when the engine had been idle); `overruns` counts the passes whose
    compute was already past it."""

    fwd_a_ms: float
    fwd_c_ms: float
    kv_bytes_per_token: int = 0
    swap_bandwidth_bps: float = 0.0
    steps: int = 0
    link_bound: int = 0  # passes that lasted as long as their budgeted copies, past T_fwd
    stalled_s: float = 0.0  # seconds passes waited for synchronous copies
    _overlap_s: float = field(default=0.0, init=False, repr=False)  # next pass's budgeted copies
    _stall_s: float = field(default=0.0, init=False, repr=False)  # its synchronous copies (s)
    overruns: int = 0
    largest_on_time: int = 0  # the most tokens a pass held to its time
    smallest_overrun: int = 0  # the fewest tokens a pass overran with (0: none yet)
    last_end: float | None = None  # perf_counter when the last pass ended
    last_report: float = 0.0  # perf_counter when the log last said how the emulation holds up

    def __post_init__(self) -> None:
        if self.fwd_a_ms < 0 or self.fwd_c_ms <= 0:
            raise ValueError("an emulated forward needs fwd_a_ms >= 0 and fwd_c_ms > 0")
        if self.swap_bandwidth_bps < 0 or self.kv_bytes_per_token < 0:
            raise ValueError("an emulated host link needs a bandwidth and KV bytes >= 0")

    def t_fwd_s(self, tokens: int) -> float:
        return (self.fwd_a_ms * tokens + self.fwd_c_ms) / 1000.0

    def copied(self, tokens: int, stalls: bool) -> None:
        """The next pass's step copies `tokens` tokens over the host link (`link_clock`)."""
        if not self.swap_bandwidth_bps:
            return
        s = tokens * self.kv_bytes_per_token / self.swap_bandwidth_bps
        if stalls:
            self._stall_s += s
        else:
            self._overlap_s += s

    def _step_s(self, tokens: int) -> float:
        """The pass's emulated time (T_fwd, the link's), and the step's copies forgotten."""
        t = self.t_fwd_s(tokens)
        if self._overlap_s > t:
            t = self._overlap_s
            self.link_bound += 1
        t += self._stall_s
        self.stalled_s += self._stall_s
        self._overlap_s = self._stall_s = 0.0
        return t

    def hold(self, started: float, tokens: int) -> None:
        """The pass that started at `started` (perf_counter) over `tokens` tokens has computed:
        wait until its emulated time is up.

        The profile's T_fwd is a whole iteration (InferCept fits it to iteration times), and
        the CPU work between two passes (scheduling, sampling, outputs) is part of it: when the
        last pass ended less than T_fwd before this one started, this one ends T_fwd after the
        last one did. After an idle gap the step has no predecessor, and T_fwd counts from now.
        """
        self.steps += 1
        t = self._step_s(tokens)
        busy = self.last_end is not None and started - self.last_end < t
        end = (self.last_end if busy and self.last_end is not None else started) + t
        left = end - time.perf_counter()
        if left > 0:
            time.sleep(left)
            self.largest_on_time = max(self.largest_on_time, tokens)
        else:
            self.overruns += 1
            if not self.smallest_overrun or tokens < self.smallest_overrun:
                self.smallest_overrun = tokens
        self.last_end = time.perf_counter()
        if not self.last_report:
            self.last_report = self.last_end  # the first report comes a period after
        elif self.last_end - self.last_report >= REPORT_EVERY_S:
            self.last_report = self.last_end
            log.info("emulated forward: %s", self.report())

    def report(self) -> str:
        overran = f", the smallest with {self.smallest_overrun} tokens" if self.overruns else ""
        link = (
            f"; {self.link_bound} as long as their copies, {self.stalled_s:.3f} s stalled for "
            "synchronous ones"
            if self.swap_bandwidth_bps
            else ""
        )
        return (
            f"{self.steps} passes, {self.overruns} past their emulated time{overran}; "
            f"the largest on time had {self.largest_on_time} tokens{link}"
        )


def clock_of(hf_config: Any) -> ForwardClock:
    spec = getattr(hf_config, EMULATE_KEY, None)
    if not isinstance(spec, dict):
        raise ValueError(f"{ARCHITECTURE} needs `{EMULATE_KEY}` in the model's config.json")
    return ForwardClock(
        float(spec["fwd_a_ms"]),
        float(spec["fwd_c_ms"]),
        int(spec.get("kv_bytes_per_token", 0)),
        # A directory written before the link was emulated has no bandwidth: copies are free.
        float(spec.get("swap_bandwidth_bps", 0.0)),
    )


def emulated_model_dir(tiny_dir: Path, profile: Profile, root: Path) -> Path:
    """A model directory beside `root` that loads as the emulated model of `profile`: the tiny
    model's files (linked), with its config.json naming the emulated architecture and carrying
    the profile's forward-time fit, host-link bandwidth and KV bytes per token (what a swap
    copy of one token moves on the device: the scheduler plans and paces copies with it,
    `real_capacities`, and the clock times them, not with the tiny model's own bytes). Reused
    when it exists."""
    out = root / f"{tiny_dir.name}-emulate-{profile.name}"
    config = json.loads((tiny_dir / "config.json").read_text())
    config["architectures"] = [ARCHITECTURE]
    config[EMULATE_KEY] = {
        "profile": profile.name,
        "fwd_a_ms": profile.fwd_a_ms,
        "fwd_c_ms": profile.fwd_c_ms,
        "kv_bytes_per_token": profile.kv_bytes_per_token,
        "swap_bandwidth_bps": profile.swap_bandwidth_bps,
    }
    text = json.dumps(config, indent=2)
    if (out / "config.json").exists() and (out / "config.json").read_text() == text:
        return out
    out.mkdir(parents=True, exist_ok=True)
    for f in tiny_dir.iterdir():
        if f.name != "config.json" and not (out / f.name).exists():
            os.symlink(f.resolve(), out / f.name)
    tmp = out / "config.json.tmp"
    tmp.write_text(text)
    tmp.replace(out / "config.json")
    return out


def profile_blocks(profile: Profile, block_size: int) -> int:
    """The profile's GPU KV capacity in blocks of `block_size` tokens (vLLM's
    `num_gpu_blocks_override`, plus the one null block vLLM keeps)."""
    return profile.gpu_kv_bytes // profile.kv_bytes_per_token // block_size + 1


def _model_class() -> type:
    """The emulated model class, built on vLLM's Llama only when vLLM asks for it."""
    from vllm.model_executor.models.llama import LlamaForCausalLM

    class _Emulated(LlamaForCausalLM):
        def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
            super().__init__(vllm_config=vllm_config, prefix=prefix)
            self.clock = clock_of(vllm_config.model_config.hf_config)
            link_clock.install(self.clock)  # this worker's swap copies take the link's time

        def forward(
            self,
            input_ids: Any,
            positions: Any,
            intermediate_tensors: Any = None,
            inputs_embeds: Any = None,
        ) -> Any:
            started = time.perf_counter()
            out = super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)
            self.clock.hold(started, int(positions.shape[-1]))
            return out

    _Emulated.__name__ = _Emulated.__qualname__ = "EmulatedLlamaForCausalLM"
    return _Emulated


def __getattr__(name: str) -> Any:
    # vLLM imports "interlude.engine.emulate:EmulatedLlamaForCausalLM": build it then, so that
    # importing this module (the plugin hook, tests of the clock) needs no vLLM model code.
    if name == "EmulatedLlamaForCausalLM":
        cls = _model_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


@dataclass(frozen=True)
class Emulated:
    """What an engine on the emulated accelerator of one profile runs with."""

    profile: Profile
    model_dir: Path
    blocks: int  # GPU KV blocks: the profile's capacity
    host_blocks: int  # the host swap pool: the profile's
    max_num_seqs: int
    max_num_batched_tokens: int


def emulated(profile_name: str, block_size: int = 32, root: Path | None = None) -> Emulated:
    """The emulated accelerator of `profile_name` (a shipped profile or a JSON path): the tiny
    model built offline (cached), its emulated directory, and the profile's capacities."""
    from interlude.engine.tiny_model import build_tiny_model, default_cache_dir
    from interlude.policy import load_profile

    profile = load_profile(profile_name)
    tiny = build_tiny_model()
    model_dir = emulated_model_dir(tiny, profile, root or default_cache_dir())
    host = profile.cpu_kv_bytes // profile.kv_bytes_per_token // block_size
    return Emulated(
        profile=profile,
        model_dir=model_dir,
        blocks=profile_blocks(profile, block_size),
        host_blocks=host,
        max_num_seqs=profile.max_num_seqs,
        max_num_batched_tokens=profile.max_batched_tokens,
    )
