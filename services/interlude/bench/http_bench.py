"""`interlude bench http`: stock vLLM's OpenAI server vs the Interlude stack, over HTTP.

What users can run themselves: the same load generator (`interlude_loadgen.http`) drives each
arm through its public API on this machine. Arms (`ARMS`):

* `vllm-noprefix`, `vllm-prefix`: stock vLLM's api_server, prefix caching off / on; the client
  runs each tool call itself and resubmits the whole conversation (`resubmit` mode);
* `vllm-prefix-sync`: the same with prefix caching and vLLM's async scheduling off, as our
  engine runs (its scheduler does not support async scheduling yet): the like-for-like arm;
* `interlude`: gateway + engine + tools-svc + Valkey; client-side tools whose results resume
  the parked session (`resume` mode).

The tiny random-weight model, the same KV blocks for all (`http_servers` derives stock vLLM's
flags from our `EngineConfig`), the InferCept trace scaled as `bench engine` scales it. Each
round is a whole experiment: every arm gets a fresh server, the reference arm runs first and
sets the round's SLO (`bench.engine_sweep.round_slo`), the others stop once past it for good.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from interlude.bench import cpu
from interlude.bench.engine_sweep import round_slo
from interlude.bench.http_servers import interlude_stack, served_name, stock_vllm
from interlude_loadgen.http.client import Target
from interlude_loadgen.http.report import judge
from interlude_loadgen.http.sweep import RunSpec, run_rates
from interlude_loadgen.http.text import TextMaker


@dataclass(frozen=True)
class Arm:
    mode: str  # the load generator's client mode
    prefix_caching: bool
    async_scheduling: bool = True  # stock vLLM's default; ours keeps it off (docs/engine.md)


ARMS: dict[str, Arm] = {
    "vllm-noprefix": Arm("resubmit", prefix_caching=False),
    "vllm-prefix": Arm("resubmit", prefix_caching=True),
    # Stock as our engine runs it: without vLLM's async scheduling (the like-for-like arm).
    "vllm-prefix-sync": Arm("resubmit", prefix_caching=True, async_scheduling=False),
    "interlude": Arm("resume", prefix_caching=True, async_scheduling=False),
}
REFERENCE_ARM = "vllm-noprefix"
# A conversation cut at the horizon while its client ran a tool leaves its session parked;
# the engine frees it at this deadline (tool times are capped at 3 s), and the sweep waits
# that long after each of interlude's rates so the next one starts with the KV free.
CLIENT_DEADLINE_S = 10.0


def server(arm: str, model: str, blocks: int, logs: Path) -> AbstractContextManager[str]:
    """The arm's server, started fresh; yields its base URL."""
    a = ARMS[arm]
    if a.mode == "resubmit":
        log = logs / f"{arm}.log"
        return stock_vllm(model, a.prefix_caching, blocks, log, async_scheduling=a.async_scheduling)
    run_dir = Path(tempfile.mkdtemp(prefix="interlude-", dir=logs))
    return interlude_stack(model, blocks, run_dir, CLIENT_DEADLINE_S)


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
) -> dict[str, Any]:
    """Every arm over `spec.rates`, `rounds` times; rows, and the SLO verdict."""
    from interlude.engine.tiny_model import build_tiny_model

    model = model or str(build_tiny_model())
    logs.mkdir(parents=True, exist_ok=True)
    order = [a for a in (REFERENCE_ARM, *arms) if a in arms]
    order = list(dict.fromkeys(order))
    rows: list[dict[str, Any]] = []
    for k in range(rounds):
        slo: float | None = None
        for n, arm in enumerate(order, 1):
            say(f"[round {k + 1}/{rounds}, arm {n}/{len(order)}] {arm}: starting its server")
            with server(arm, model, blocks, logs) as url:
                target = Target(url, served_name(model), ARMS[arm].mode)
                settle = CLIENT_DEADLINE_S + 1 if ARMS[arm].mode == "resume" else 1.0
                ref = arm == REFERENCE_ARM
                done = run_rates(
                    arm, target, spec, texts, k, slo, progress, settle, ref, cpu=cpu.meter
                )
            rows += done
            if arm == REFERENCE_ARM:
                slo = round_slo(done)
                say(f"  round {k + 1} SLO: {slo * 1000:.1f} ms/token")
    meta = {
        "arms": {a: asdict(ARMS[a]) for a in order},
        "model": model,
        "blocks": blocks,
        "block_size": 32,
        "workload": spec.workload,
        "rates": list(spec.rates),
        "duration_s": spec.duration_s,
        "horizon_s": spec.horizon,
        "rounds": rounds,
        "scale": asdict(spec.scale),
        "logs": str(logs),
    }
    verdict = judge(rows, REFERENCE_ARM) if REFERENCE_ARM in arms else {}
    serving = cpu.serving_ms_per_token(rows)
    return {"meta": meta, "rows": rows, "verdict": verdict, "serving_cpu_ms_per_token": serving}
