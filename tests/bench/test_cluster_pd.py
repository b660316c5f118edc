"""The prefill/decode cluster model (bench/cluster_pd.py): every request is accounted for, the
phases run where their role says, the KV crossing costs its bytes over the link, and the
report picks the best split."""

from __future__ import annotations

import pytest

from interlude.bench.cluster_pd import PDSpec, best_rows, capacity_rps, run_pd, run_split
from interlude.bench.cluster_pd_report import markdown_rows
from interlude.policy import load_profile

P = load_profile("llama3-8b-h100")


def test_a_light_load_finishes_everything_and_first_tokens_come_at_once() -> None:
    spec = PDSpec(klass="LPLD", load=0.3, duration_s=20.0)
    for prefill in (0, 1, 2):
        m = run_split(spec, P, prefill)
        assert m["arrived"] > 100 and m["unfinished"] == 0
        # An idle engine prefills a 64-512-token prompt in one step (saturation 1,024).
        assert m["ttft_p50_s"] < 2 * P.t_fwd(P.saturation_tokens)
        assert m["jct_p99_s"] > m["ttft_p99_s"]


def test_decode_engines_make_tokens_unhindered_by_prompts() -> None:
    """The point of the split: on heavy prompts a mixed engine's decodes share steps with
    prompt chunks, a decode engine's do not."""
    spec = PDSpec(klass="HPHD", load=0.5, duration_s=40.0)
    mixed, split = run_split(spec, P, 0), run_split(spec, P, 2)
    assert split["tpot_p99_ms"] < 0.8 * mixed["tpot_p99_ms"]
    assert split["tpot_p99_ms"] < 1.5 * P.t_fwd(64) * 1e3  # a decode step, give or take


def test_a_slow_link_shows_in_the_job_time() -> None:
    fast = run_split(PDSpec(klass="HPLD", load=0.3, duration_s=20.0), P, 2)
    slow = run_split(PDSpec(klass="HPLD", load=0.3, duration_s=20.0, link_bytes_per_s=1e9), P, 2)
    # 1,024-4,096 prompt tokens x 128 KiB at 1 GB/s: 0.13-0.54 s more before decoding starts.
    assert slow["jct_p50_s"] > fast["jct_p50_s"] + 0.1
    assert slow["ttft_p50_s"] == pytest.approx(fast["ttft_p50_s"])  # made before the crossing


def test_the_report_compares_mixed_with_the_best_split() -> None:
    result = run_pd(PDSpec(duration_s=10.0), P, (0.3,), (0, 1))
    assert len(result["rows"]) == 4 * 1 * 2 * 4  # classes x loads x rounds x splits
    rows = best_rows(result)
    assert len(rows) == 4 and all(r["best_split"] in ("1P3D", "2P2D", "3P1D") for r in rows)
    assert len(markdown_rows(result)) == 2 + 4
    assert capacity_rps(P, "LPLD", 4) > capacity_rps(P, "HPHD", 4)
    with pytest.raises(ValueError, match="klass"):
        PDSpec(klass="XL")
