"""From measurements to a `Profile` (pure: no engine; `profiler.py` does the measuring).

`ProfileSpec` says what to measure, `ladders` turns it into the sizes a given engine allows,
`Measurements` holds what came back, and `build_run` makes the profile with a `sources` note
for every number that carries enough raw data to judge it later.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from interlude.policy import Profile
from interlude.profiling.fit import (
    LinearFit,
    Point,
    fit_knee,
    fit_linear,
    median_points,
    saturation_point,
)

FAMILIES = ("decode", "packed", "lone")


@dataclass(frozen=True)
class ProfileSpec:
    """What to measure; ladders are capped at the engine's limits, which are then added."""

    reps: int = 5  # repetitions per point; the median is kept
    lone_lengths: tuple[int, ...] = (1, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048)
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 128, 256)  # decode B, k
    include_limits: bool = True  # also measure at the largest n the engine allows
    decode_prompt: int = 4  # tokens per decode request's prompt
    decode_steps: int = 16  # tokens each decode request generates
    warmup: int = 3  # untimed batches first: lazy initialisation is not an iteration cost
    swap_reps: int = 10
    fraction: float = 0.9  # S: smallest n reaching this share of the best throughput

    def __post_init__(self) -> None:
        if self.reps < 1 or self.swap_reps < 1 or self.warmup < 0 or self.decode_prompt < 1:
            raise ValueError("ProfileSpec: reps, swap_reps, decode_prompt >= 1; warmup >= 0")
        if self.decode_steps < 2:
            raise ValueError("ProfileSpec.decode_steps must be >= 2 (a period needs two tokens)")
        if not 0 < self.fraction < 1:
            raise ValueError("ProfileSpec.fraction must be in (0, 1)")
        if min(self.lone_lengths + self.batch_sizes, default=0) < 1:
            raise ValueError("ProfileSpec: ladder values must be >= 1")


@dataclass(frozen=True)
class Limits:
    """The running engine's own numbers (after vLLM resolved defaults and memory)."""

    num_blocks: int  # KV blocks, vLLM's null block 0 included
    block_size: int
    max_num_seqs: int
    max_batched_tokens: int
    max_model_len: int
    vocab: int


def ladders(spec: ProfileSpec, lim: Limits) -> dict[str, list[int]]:
    """Per family, the sizes to measure: prompt length (lone), requests per batch (others).

    Caps keep each point one iteration that fits: a lone prompt within the token budget and
    the context limit; packed prompts of one block each within the budget, the sequence limit
    and the free blocks; decode requests within the sequence limit and the free blocks.
    """
    free = lim.num_blocks - 1  # block 0 is vLLM's null block
    per_decode = -(-(spec.decode_prompt + spec.decode_steps) // lim.block_size)
    caps = {
        "decode": min(lim.max_num_seqs, free // per_decode),
        "packed": min(lim.max_num_seqs, free, lim.max_batched_tokens // lim.block_size),
        "lone": min(lim.max_batched_tokens, lim.max_model_len - 1, free * lim.block_size),
    }
    out = {}
    for family, cap in caps.items():
        base = spec.lone_lengths if family == "lone" else spec.batch_sizes
        top = {cap} if spec.include_limits and cap > 0 else set()
        out[family] = sorted({s for s in base if s <= cap} | top)
    return out


def tokens_of(family: str, size: int, lim: Limits) -> int:
    """Tokens scheduled in the measured iteration of a point of `family` and `size`."""
    return size * lim.block_size if family == "packed" else size


@dataclass(frozen=True)
class Measurements:
    """What `profiler.measure` brought back from one engine."""

    points: tuple[Point, ...]  # every kept repetition
    discarded: int  # repetitions dropped because a batch was not admitted in one iteration
    limits: Limits
    kv_bytes_per_token: int  # from the model config
    host_blocks: int  # the engine config's host pool
    swap: dict[str, Any] = field(hash=False)  # ProfilerWorkerExtension.interlude_swap_bench
    kv: dict[str, Any] = field(hash=False)  # ProfilerWorkerExtension.interlude_kv_info
    stamp: str = "measured by interlude profile"  # "... on <host>, <device>, <date>"


@dataclass(frozen=True)
class ProfileRun:
    """A profile and the numbers behind it."""

    profile: Profile
    points: tuple[Point, ...]  # medians, one per (family, tokens)
    fit: LinearFit
    knee: float  # fit_knee: where the fitted line reaches `fraction` of its throughput limit
    save_bps: float  # device -> host
    load_bps: float  # host -> device
    discarded: int


def build_run(m: Measurements, spec: ProfileSpec, name: str) -> ProfileRun:
    """Fit, find S, and assemble the profile. Raises ValueError if the numbers cannot make a
    valid Profile (e.g. a fit with c = 0, or too few points)."""
    points = median_points(m.points)
    fit = fit_linear(points)
    sat = saturation_point(points, spec.fraction)
    save_bps, load_bps = m.swap["bytes"] / m.swap["save_s"], m.swap["bytes"] / m.swap["load_s"]
    lim, per_token = m.limits, m.kv_bytes_per_token
    profile = Profile(
        name=name,
        kv_bytes_per_token=per_token,
        fwd_a_ms=round(fit.a_ms, 6),
        fwd_c_ms=round(fit.c_ms, 4),
        saturation_tokens=sat,
        swap_bandwidth_bps=float(f"{min(save_bps, load_bps):.4g}"),
        gpu_kv_bytes=lim.num_blocks * lim.block_size * per_token,
        cpu_kv_bytes=max(1, m.host_blocks) * lim.block_size * per_token,
        block_size=lim.block_size,
        max_num_seqs=lim.max_num_seqs,
        max_batched_tokens=lim.max_batched_tokens,
        sources=_sources(m, spec, points, fit, sat),
    )
    knee = fit_knee(fit, spec.fraction)
    return ProfileRun(profile, tuple(points), fit, knee, save_bps, load_bps, m.discarded)


def _sources(
    m: Measurements, spec: ProfileSpec, points: list[Point], fit: LinearFit, sat: int
) -> dict[str, str]:
    lim, per_token, stamp, swap, kv = m.limits, m.kv_bytes_per_token, m.stamp, m.swap, m.kv
    fams = {f: [p.tokens for p in points if p.family == f] for f in FAMILIES}
    ladder = "; ".join(f"{f} n={','.join(map(str, ns))}" for f, ns in fams.items() if ns)
    data = ", ".join(f"{p.family[0]}{p.tokens}:{p.ms:.2f}" for p in points)
    alone = [
        f"{f} {g.a_ms:.4f}*n+{g.c_ms:.2f} (RMS error {g.rms_rel_err:.0%})"
        for f in FAMILIES
        if len({p.tokens for p in points if p.family == f}) > 1
        for g in [fit_linear([p for p in points if p.family == f])]
    ]
    best = max(points, key=lambda p: p.tokens_per_s)
    tensor_per_token = kv["bytes"] // max(1, kv["num_blocks"] * lim.block_size)
    host = "pinned host memory" if kv["device"].startswith("GPU") else "CPU to CPU"
    pct = f"{spec.fraction:.0%}"
    return {
        "kv_bytes_per_token": (
            f"model config: layers x 2 (K,V) x KV heads x head size x dtype bytes = {per_token}; "
            f"the engine's KV tensors ({kv['dtype']}, {kv['shapes'][0]} per layer) hold "
            f"{tensor_per_token} bytes per token"
        ),
        "fwd_a_ms": (
            f"{stamp}: T = a*n + c by least squares of relative errors (weights 1/T^2) over "
            f"{len(points)} medians of {spec.reps} reps of iterations timed by vLLM's "
            f"engine-core stamps ({ladder}; d=decode batch of B, p=packed one-block prompts, "
            f"l=lone prompt); R^2 = {fit.r2:.4f}, RMS relative error {fit.rms_rel_err:.1%}"
            f"{' (a or c held at 0)' if fit.constrained else ''}; stock vLLM scheduler, prefix "
            f"caching off; fits per family alone: {'; '.join(alone)}; points family+n:ms = "
            f"{data}"
        ),
        "fwd_c_ms": f"{stamp}: intercept of the fit described under fwd_a_ms",
        "saturation_tokens": (
            f"{stamp}: smallest measured n whose throughput reaches {pct} of the best measured "
            f"({best.tokens_per_s:,.0f} tokens/s at {best.family} n={best.tokens}); the fitted "
            f"line reaches {pct} of its limit 1/a at n = {fit_knee(fit, spec.fraction):,.0f}; "
            f"n is capped by the engine's token budget and KV pool"
        ),
        "swap_bandwidth_bps": (
            f"{stamp}: min of both directions; micro-benchmark in the engine's worker process on "
            f"its own KV tensors with HostSwapConnector's BlockCopier ({host}), "
            f"{swap['blocks']} blocks of all layers ({swap['bytes']:,} bytes) per copy, median "
            f"of {spec.swap_reps}: device->host {swap['bytes'] / swap['save_s'] / 1e9:.3f} GB/s, "
            f"host->device {swap['bytes'] / swap['load_s'] / 1e9:.3f} GB/s"
        ),
        "gpu_kv_bytes": (
            f"the engine's {lim.num_blocks} KV blocks x {lim.block_size} tokens x {per_token} B"
        ),
        "cpu_kv_bytes": f"host_blocks={m.host_blocks} (at least 1) x block bytes",
        "block_size": "the engine's block_size",
        "max_num_seqs": "the engine's max_num_seqs",
        "max_batched_tokens": "the engine's max_num_batched_tokens",
    }


# A smoke-test ladder (`interlude profile --quick`, the engine test): seconds, not minutes;
# too few points for a profile worth shipping.
QUICK = ProfileSpec(
    reps=2,
    lone_lengths=(1, 64, 256),
    batch_sizes=(1, 8),
    include_limits=False,
    decode_steps=6,
    warmup=1,
    swap_reps=3,
)


def tables(run: ProfileRun) -> tuple[Any, Any]:
    """Two rich tables: the measured points against the fit, and the profile's numbers."""
    from rich.table import Table

    pts = Table("family", "n tokens", "median ms", "fit ms", "tokens/s", title="iterations")
    for p in run.points:
        sat = " (S)" if p.tokens == run.profile.saturation_tokens else ""
        pts.add_row(
            p.family,
            f"{p.tokens}{sat}",
            f"{p.ms:.2f}",
            f"{run.fit.at(p.tokens):.2f}",
            f"{p.tokens_per_s:,.0f}",
        )
    pr = run.profile
    prof = Table("field", "value", title=f"profile {pr.name}")
    rows = {
        "T_fwd(n)": f"{pr.fwd_a_ms:.6f} * n + {pr.fwd_c_ms:.4f} ms",
        "fit quality": f"R^2 {run.fit.r2:.4f}, RMS relative error {run.fit.rms_rel_err:.1%}",
        "saturation_tokens S": f"{pr.saturation_tokens} (the fit's knee: {run.knee:,.0f})",
        "swap_bandwidth_bps": f"{pr.swap_bandwidth_bps / 1e9:.3f} GB/s (device->host "
        f"{run.save_bps / 1e9:.3f}, host->device {run.load_bps / 1e9:.3f})",
        "kv_bytes_per_token": str(pr.kv_bytes_per_token),
        "gpu_kv_bytes": f"{pr.gpu_kv_bytes:,} ({pr.gpu_blocks} blocks of {pr.block_size})",
        "cpu_kv_bytes": f"{pr.cpu_kv_bytes:,} ({pr.cpu_blocks} blocks)",
        "max_num_seqs / max_batched_tokens": f"{pr.max_num_seqs} / {pr.max_batched_tokens}",
        "discarded repetitions": str(run.discarded),
    }
    for key, value in rows.items():
        prof.add_row(key, value)
    return pts, prof
