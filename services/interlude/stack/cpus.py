"""Which cores each engine's vLLM worker uses when several engines share one machine.

vLLM's CPU build binds its worker's OpenMP threads itself (`VLLM_CPU_OMP_THREADS_BIND`, by
default `auto`), and `auto` picks the same cores for every engine on a machine: on 2 cores,
core 0 for each (core 1 is left to the front ends). Two engines on one core do worse than take
turns. A worker that has just stepped keeps polling its input queue for a second (vLLM's
shared-memory queue spins on `sched_yield` for 1 s after each read), so the other engine's
forward runs on what that spin leaves it: through the gateway, alternate 30-token answers took
about 1,050 ms instead of 110-130 ms (docs/engine.md, "Engines sharing a machine"). Each
engine gets cores of its own here.

In Kubernetes, each engine pod has its own cgroup cpuset and `auto` binds inside it: this is
for engines that share one machine's cores without one (`interlude up`, the tests).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

AUTO = "auto"  # vLLM's own choice; what one engine alone keeps


def available_cores() -> list[tuple[int, ...]]:
    """The physical cores this process may run on, each as its logical CPUs in its affinity
    mask (hyperthread siblings together, from sysfs; each CPU alone where sysfs does not say)."""
    allowed = sorted(os.sched_getaffinity(0))
    return group_siblings(allowed, _siblings)


def _siblings(cpu: int) -> str | None:
    path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
    try:
        return path.read_text().strip()
    except OSError:
        return None


def group_siblings(
    cpus: Sequence[int], siblings: Callable[[int], str | None]
) -> list[tuple[int, ...]]:
    """`cpus` grouped by physical core (`siblings(cpu)`: its core's CPU list in vLLM's syntax,
    or None), in order of each core's first CPU."""
    allowed, cores = set(cpus), []
    seen: set[int] = set()
    for cpu in sorted(cpus):
        if cpu in seen:
            continue
        text = siblings(cpu)
        group = sorted(set(parse_id_list(text)) & allowed) if text else [cpu]
        group = group if cpu in group else [cpu]
        seen.update(group)
        cores.append(tuple(group))
    return cores


def id_list(cpus: Sequence[int]) -> str:
    """`cpus` in vLLM's list syntax, runs folded into ranges: [0, 1, 2, 5] -> '0-2,5'."""
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def parse_id_list(text: str) -> list[int]:
    """vLLM's list syntax back to cores ('0-2,5' -> [0, 1, 2, 5]); ValueError if malformed."""
    cpus: list[int] = []
    for item in text.split(","):
        lo, sep, hi = item.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"not a core list like '0-3,6': {text!r}")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"a range runs low to high, got {item.strip()!r} in {text!r}")
        cpus.extend(range(first, last + 1))
    return cpus


def engine_binds(engines: int, cores: Sequence[Sequence[int]]) -> list[str]:
    """`VLLM_CPU_OMP_THREADS_BIND` for each of `engines` engines sharing `cores` (physical
    cores, each as its logical CPUs: `available_cores`).

    One engine keeps `auto`. Several split the cores into disjoint runs of
    `len(cores) // engines` (cores left over stay unbound, for the front ends, the gateway and
    the tools worker), binding one logical CPU per core as vLLM's `auto` does on x86 (OpenMP
    threads on two siblings of one core slow each other). With fewer cores than engines no
    split is disjoint: engines share cores round robin, and `shared_cores` says which.
    """
    if engines < 1:
        raise ValueError(f"engines must be >= 1, got {engines}")
    if not cores or not all(cores):
        raise ValueError(f"no cores to bind engines to: {cores!r}")
    if engines == 1:
        return [AUTO]
    firsts = [min(core) for core in cores]
    if len(firsts) < engines:
        return [str(firsts[i % len(firsts)]) for i in range(engines)]
    share = len(firsts) // engines
    return [id_list(firsts[i * share : (i + 1) * share]) for i in range(engines)]


def shared_cores(binds: Sequence[str]) -> list[int]:
    """The cores two or more of `binds` name (`auto` counts as no core of its own)."""
    seen: dict[int, int] = {}
    for bind in binds:
        if bind != AUTO:
            for c in set(parse_id_list(bind)):
                seen[c] = seen.get(c, 0) + 1
    return sorted(c for c, n in seen.items() if n > 1)


def check_binds(binds: Sequence[str], engines: int) -> None:
    """ValueError unless `binds` is one core list (or `auto`) per engine."""
    if len(binds) != engines:
        raise ValueError(f"one core list per engine: {engines} engines, {len(binds)} lists")
    for bind in binds:
        if bind != AUTO:
            parse_id_list(bind)
