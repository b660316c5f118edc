"""`interlude bench pd` (bench/cluster_pd.py) on the simulator's cluster: the splits it
compares, TetriInfer's point on heavy prompts, the agent variant with the resume rule, and
the report's tables."""

from __future__ import annotations

import pytest

from interlude.bench.cluster_pd import (
    PDSpec,
    best_rows,
    capacity_rps,
    class_pool,
    run_agents,
    run_pd,
    run_split,
    splits,
)
from interlude.bench.cluster_pd_report import markdown_rows
from interlude.policy import load_profile
from interlude_workloads import resolve_workload

P = load_profile("llama3-8b-h100")


def test_every_split_of_the_same_engines_is_compared_with_all_mixed() -> None:
    assert splits(3) == [
        ("mixed", ("mixed", "mixed", "mixed")),
        ("1P2D", ("prefill", "decode", "decode")),
        ("2P1D", ("prefill", "prefill", "decode")),
    ]
    assert capacity_rps(P, "LPLD", 4) > capacity_rps(P, "HPHD", 4)
    with pytest.raises(ValueError, match="class must be one of"):
        class_pool("XL", 0)
    with pytest.raises(ValueError, match="engines"):
        PDSpec(engines=1)


def test_decode_engines_make_tokens_unhindered_by_long_prompts() -> None:
    """TetriInfer's point: on heavy prompts a mixed engine's decodes share steps with prompt
    chunks, a decode engine's do not."""
    spec = PDSpec(duration_s=40.0)
    pool = class_pool("HPHD", 0)
    rate = 0.5 * capacity_rps(P, "HPHD", 4)
    mixed = run_split(spec, P, pool, rate, splits(4)[0][1], 0)
    split = run_split(spec, P, pool, rate, splits(4)[2][1], 0)  # 2P2D
    assert mixed["unfinished"] == split["unfinished"] == 0
    assert split["norm_p99_ms"] < mixed["norm_p99_ms"]
    assert split["linked_tokens"] > 0 and mixed["linked_tokens"] == 0


def test_the_classes_report_compares_mixed_with_the_best_split() -> None:
    result = run_pd(PDSpec(duration_s=10.0), "llama3-8b-h100", (0.3,), (0,), classes=("LPLD",))
    assert [r["split"] for r in result["rows"]] == ["mixed", "1P3D", "2P2D", "3P1D"]
    (row,) = best_rows(result)
    assert row["best_split"] in ("1P3D", "2P2D", "3P1D")
    assert len(markdown_rows(result)) == 2 + 1


def test_the_agent_run_tries_each_split_with_and_without_the_resume_rule() -> None:
    pool = resolve_workload("generated:mixed", 0)
    result = run_agents(PDSpec(engines=2, duration_s=20.0), "gptj-6b-a100-40g", pool, (2.0,), (0,))
    result["workload"] = "generated:mixed"
    assert [r["split"] for r in result["rows"]] == ["mixed", "1P1D", "1P1D+resume"]
    assert all(r["arrived"] > 20 and r["unfinished"] < r["arrived"] for r in result["rows"])
    lines = markdown_rows(result)
    assert len(lines) == 2 + 3 and "resume wait" in lines[0]
