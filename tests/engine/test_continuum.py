"""Continuum on the real engine: its TTL decides, per call, whether the KV waits for the tool."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from interlude.bench.scripted import ScriptedSession, Step
from interlude.policy import load_profile

pytestmark = pytest.mark.engine  # starts real vLLM engines

# Calls of 0.3 s and 0.15 s, at contexts of ~108 and ~160 tokens.
SESSIONS = [
    ScriptedSession(
        f"s{i}",
        tuple(range(20 + i, 120 + i)),
        (Step(8, "calculator", 0.3, 5), Step(6, "search", 0.15, 40), Step(5)),
        kind="qa",
    )
    for i in range(4)
]


async def run_all(engine: Any) -> tuple[list[Any], dict[str, Any]]:
    results = await asyncio.gather(*(engine.run_scripted(s) for s in SESSIONS))
    await asyncio.sleep(0.3)  # one more engine step publishes the counters
    return results, engine.stats()


def slow_profile(tmp_path: Path) -> str:
    """The tiny CPU profile, but 30 ms a token: reloading ~100 tokens costs over 3 s, so the
    cold-start TTL is ln(B / 1 s) > 1 s, longer than either call."""
    p = dataclasses.replace(load_profile("tiny-llama-cpu"), fwd_a_ms=30.0)
    path = tmp_path / "slow.json"
    path.write_text(json.dumps(dataclasses.asdict(p)))
    return str(path)


@pytest.mark.parametrize("slow", [False, True])
def test_continuum_keeps_kv_only_when_its_ttl_outlasts_the_call(
    with_engine: Any, tmp_path: Path, slow: bool
) -> None:
    kw = {"profile": slow_profile(tmp_path)} if slow else {}
    results, stats = with_engine(run_all, policy="continuum", **kw)
    assert all(r.ok for r in results)
    assert [[len(t) for t in r.turns] for r in results] == [[8, 6, 5]] * 4
    if slow:
        assert stats["resumes"] == {"preserve": 8}  # every call came back within its TTL
    else:
        # The measured profile reloads ~100 tokens in ~12 ms: a TTL of 0, the KV goes at
        # once and comes back from the prefix cache.
        assert stats["resumes"] == {"prefix-cache": 8}
    assert stats["parked_requests"] == 0
    assert stats["free_gpu_blocks"] == stats["total_gpu_blocks"] - 1
