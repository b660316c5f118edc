"""`interlude bench http`: stock vLLM's OpenAI server vs the Interlude stack, over HTTP.

What users can run themselves: the same load generator (`interlude.loadgen`) drives each
arm through its public API on this machine. Arms (`ARMS`):

* `vllm-noprefix`, `vllm-prefix`: stock vLLM's api_server, prefix caching off / on; the client
  runs each tool call itself and resubmits the whole conversation (`resubmit` mode);
* `vllm-prefix-sync`: the same with prefix caching and vLLM's async scheduling off, as our
  engine runs (its scheduler does not support async scheduling yet): the like-for-like arm;
* `interlude`: gateway + engine + tools-svc + Valkey; client-side tools whose results resume
  the parked session (`resume` mode).
* `interlude-http`: the `interlude` stack with its gateway calling the engine over an HTTP
  connection per request, not over its multiplexed link (`api/mux.py`);
* `interlude-envoy`: the `interlude` stack, called through a real Envoy that asks `interlude
  picker` for each request (the InferencePool path, docs/routing.md) instead of our gateway;
* `interlude-2`, `interlude-pd`: the same with two engines, each on cores of its own (on this
  2-core machine, one each), both mixed or a prefill and a decode engine (TetriInfer's
  disaggregation, KV over host shared memory: docs/disaggregation.md). Equal hardware to each
  other, not to the one-engine arms.

The tiny random-weight model, the same KV blocks for all (`http_servers` derives stock vLLM's
flags from our `EngineConfig`), the InferCept trace scaled as `bench engine` scales it; or,
with an `Emulation`, every arm on the same emulated accelerator and the trace at its own scale
(`http_emulated`). Each round is a whole experiment: every arm gets a fresh server, the
reference arm runs first and sets the round's SLO (`slo.round_slo`), the others
stop once past it for good. On the CPU build vLLM turns async scheduling off by itself
(`CpuPlatform`), so there `vllm-prefix-sync` is `vllm-prefix`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from interlude.bench import cpu, resume_start
from interlude.bench.http_emulated import Emulation, emulation_meta, in_device_time
from interlude.bench.http_servers import interlude_stack, served_name, stock_vllm
from interlude.engine.emulate import Emulated
from interlude.loadgen.client import Target
from interlude.loadgen.report import judge
from interlude.loadgen.sweep import RunSpec, planned, run_rates
from interlude.loadgen.text import TextMaker
from interlude.slo import round_slo


@dataclass(frozen=True)
class Arm:
    mode: str  # the load generator's client mode
    prefix_caching: bool
    async_scheduling: bool = True  # stock vLLM's default; ours keeps it off (docs/engine.md)
    roles: tuple[str, ...] = ("mixed",)  # our stack's engines, one role each
    # What the client calls: our gateway (`gateway-http`: its engines over a connection per
    # request, not its links), or Envoy + the picker.
    front: str = "gateway"


ARMS: dict[str, Arm] = {
    "vllm-noprefix": Arm("resubmit", prefix_caching=False),
    "vllm-prefix": Arm("resubmit", prefix_caching=True),
    # Stock as our engine runs it: without vLLM's async scheduling (the like-for-like arm).
    "vllm-prefix-sync": Arm("resubmit", prefix_caching=True, async_scheduling=False),
    "interlude": Arm("resume", prefix_caching=True, async_scheduling=False),
    "interlude-2": Arm("resume", True, False, roles=("mixed", "mixed")),
    "interlude-pd": Arm("resume", True, False, roles=("prefill", "decode")),
    # The InferencePool path: a real Envoy carries the bytes, `interlude picker` chooses.
    "interlude-envoy": Arm("resume", True, False, front="envoy"),
    # The gateway before its links (`api/mux.py`): an HTTP connection per request to the engine.
    "interlude-http": Arm("resume", True, False, front="gateway-http"),
}
REFERENCE_ARM = "vllm-noprefix"
# A conversation cut at the horizon while its client ran a tool leaves its session parked;
# the engine frees it this long past the longest tool call (`client_deadline_s`), and the
# sweep waits that long after a rate of interlude's that left any, so the next one starts
# with the KV free.
DEADLINE_MARGIN_S = 7.0


@dataclass(frozen=True)
class Device:
    """What every arm's server runs: `model` with `blocks` KV blocks, or, with `emulated`, the
    tiny model on that emulated device (`profile_path`: its profile, for our engine)."""

    model: str
    blocks: int
    emulated: Emulated | None = None
    profile_path: str | None = None
    stream_interval: int = 1  # tokens per streamed chunk, every arm's server alike


def server(
    arm: str, device: Device, logs: Path, deadline_s: float, run_dir: Path
) -> AbstractContextManager[str]:
    """The arm's server, started fresh; yields its base URL. `deadline_s`: how long our engine
    keeps a session parked for its client; `run_dir`: where our stack runs (a fresh folder)."""
    a = ARMS[arm]
    emu = device.emulated
    if a.mode == "resubmit":
        log = logs / f"{arm}.log"
        batch = (emu.max_num_seqs, emu.max_num_batched_tokens) if emu else None
        return stock_vllm(
            device.model, a.prefix_caching, device.blocks, log,
            async_scheduling=a.async_scheduling, batch=batch,
            stream_interval=device.stream_interval,
        )  # fmt: skip
    return interlude_stack(
        device.model, device.blocks, run_dir, deadline_s, device.profile_path, a.roles, a.front,
        device.stream_interval,
    )  # fmt: skip


def client_deadline_s(spec: RunSpec) -> float:
    """Past the longest tool call any rate's conversations make their client run: a session
    parked for a tool the client still runs must not be freed under it."""
    longest = max((step.delay_s for conv in planned(spec) for step in conv.steps), default=0.0)
    return DEADLINE_MARGIN_S + longest


def run_http_bench(
    spec: RunSpec,
    arms: Sequence[str],
    rounds: int,
    blocks: int,
    logs: Path,
    texts: TextMaker,
    progress: Callable[[str, Any], Any] | None,
    say: Callable[[str], None],
    model: str | None = None,
    emulation: Emulation | None = None,
    slo: float | None = None,
    stream_interval: int = 1,
) -> dict[str, Any]:
    """Every arm over `spec.rates`, `rounds` times; rows, and the SLO verdict. With
    `emulation`, every arm on that emulated device (`model` and `blocks` unused), and `spec`'s
    rates and the rows on the device's clock (`http_emulated`). `slo` (s/token, on the rows'
    clock) replaces the reference arm's in every round, so a sweep can go on from an earlier
    one at higher rates without the reference arm. `stream_interval`: tokens per streamed
    chunk, every arm's server alike."""
    logs.mkdir(parents=True, exist_ok=True)
    device = replace(_device(model, blocks, emulation, logs), stream_interval=stream_interval)
    if emulation is not None:
        spec = emulation.wall_spec(spec)
    deadline = client_deadline_s(spec)
    dilation = emulation.dilation if emulation is not None else 1.0
    wall_slo = slo * dilation if slo is not None else None
    order = list(dict.fromkeys(a for a in (REFERENCE_ARM, *arms) if a in arms))
    rows: list[dict[str, Any]] = []
    for k in range(rounds):
        round_slo_s = wall_slo
        for n, arm in enumerate(order, 1):
            say(f"[round {k + 1}/{rounds}, arm {n}/{len(order)}] {arm}: starting its server")
            resumes = ARMS[arm].mode == "resume"
            run_dir = Path(tempfile.mkdtemp(prefix=f"{arm}-", dir=logs)) if resumes else logs
            with server(arm, device, logs, deadline, run_dir) as url:
                target = Target(url, served_name(device.model), ARMS[arm].mode)
                settle = deadline + 1 if resumes else 1.0
                ref = arm == REFERENCE_ARM and wall_slo is None
                meters = _meters(arm, run_dir)
                done = run_rates(
                    arm, target, spec, texts, k, round_slo_s, progress, settle, ref, meters
                )
            rows += done
            if arm == REFERENCE_ARM and wall_slo is None:
                round_slo_s = round_slo(done)
                say(f"  round {k + 1} SLO: {round_slo_s * 1000:.1f} ms/token (wall clock)")
    meta = _meta(spec, order, device, rounds, slo, logs)
    if emulation is not None:
        rows = in_device_time(rows, emulation.dilation)
        if device.emulated is not None:
            meta["emulation"] = emulation_meta(emulation, device.emulated)
    judged = REFERENCE_ARM in arms or slo is not None
    verdict = judge(rows, REFERENCE_ARM, slo) if judged else {}
    serving = cpu.serving_ms_per_token(rows)
    return {
        "meta": meta,
        "rows": rows,
        "verdict": verdict,
        "serving_cpu_ms_per_token": serving,
        "resume_start": resume_start.by_arm(rows),
    }


def _meta(
    spec: RunSpec, order: Sequence[str], device: Device, rounds: int, slo: float | None, logs: Path
) -> dict[str, Any]:
    """What a sweep ran: its arms, device, workload and rates (the result's `meta`)."""
    return {
        "arms": {a: asdict(ARMS[a]) for a in order},
        "model": device.model,
        "blocks": device.blocks,
        "block_size": 32,
        "stream_interval": device.stream_interval,
        "workload": spec.workload,
        "rates": list(spec.rates),
        "duration_s": spec.duration_s,
        "horizon_s": spec.horizon,
        "rounds": rounds,
        "slo_given_s_per_token": slo,
        "scale": asdict(spec.scale),
        "logs": str(logs),
    }


def _meters(arm: str, run_dir: Path) -> dict[str, Callable[[], Callable[[], Any]]]:
    """What each rate's row measures of the servers: every arm its processes' CPU seconds
    (`cpu_s`); ours also how soon resumed turns started on the engines (`resume_start`)."""
    meters: dict[str, Callable[[], Callable[[], Any]]] = {"cpu_s": cpu.meter}
    if ARMS[arm].mode == "resume":
        meters["resume_start"] = lambda: resume_start.meter(run_dir)
    return meters


def _device(model: str | None, blocks: int, emulation: Emulation | None, logs: Path) -> Device:
    if emulation is not None:
        path, emu = emulation.prepare(logs)
        return Device(str(emu.model_dir), emu.blocks, emu, path)
    from interlude.engine.tiny_model import build_tiny_model

    return Device(model or str(build_tiny_model()), blocks)
