"""`interlude profile`: the fit and saturation math on synthetic points, and one real run."""

from __future__ import annotations

import dataclasses
import math
import re
from fractions import Fraction
from pathlib import Path

import pytest
from typer.testing import CliRunner

from interlude.policy import Profile, load_profile
from interlude.profiling.build import (
    QUICK,
    Limits,
    Measurements,
    ProfileSpec,
    build_run,
    ladders,
    tokens_of,
)
from interlude.profiling.fit import (
    Point,
    fit_knee,
    fit_linear,
    median_points,
    saturation_point,
)

NUMERIC = {f.name for f in dataclasses.fields(Profile)} - {"name", "sources"}


def line(a: float, c: float, ns: list[int], family: str = "lone") -> list[Point]:
    return [Point(family, n, a * n + c) for n in ns]


# --- the fit ------------------------------------------------------------------------------
@pytest.mark.parametrize("relative", [True, False])
def test_fit_recovers_an_exact_line(relative: bool) -> None:
    pts = line(0.05, 8.0, [1, 16, 64, 256, 1024]) + line(0.05, 8.0, [4], "decode")
    fit = fit_linear(pts, relative=relative)
    assert fit.a_ms == pytest.approx(0.05, rel=1e-12)
    assert fit.c_ms == pytest.approx(8.0, rel=1e-12)
    assert fit.r2 == pytest.approx(1.0) and fit.rms_rel_err == pytest.approx(0.0, abs=1e-12)
    assert not fit.constrained and fit.relative is relative
    assert fit.at(100) == pytest.approx(13.0)


NOISY = [Point("lone", 1, 1.0), Point("lone", 2, 3.0), Point("lone", 3, 2.0)]


def test_plain_fit_of_noisy_points_is_ordinary_least_squares() -> None:
    # y = 1, 3, 2 at n = 1, 2, 3: mean n 2, mean y 2; Sxy = (-1)(-1) + 0 + (1)(0) = 1, Sxx = 2,
    # so a = 0.5, c = 2 - 0.5 x 2 = 1; residuals -0.5, 1, -0.5: SS_res 1.5 of SS_tot 2.
    fit = fit_linear(NOISY, relative=False)
    assert (fit.a_ms, fit.c_ms) == pytest.approx((0.5, 1.0))
    assert fit.r2 == pytest.approx(0.25)
    # Fitted 1.5, 2, 2.5 against 1, 3, 2: relative errors +50%, -33.3%, +25%.
    assert fit.rms_rel_err == pytest.approx(math.sqrt((0.25 + 1 / 9 + 0.0625) / 3))


def test_relative_fit_solves_the_weighted_normal_equations() -> None:
    # Weights 1/y^2 = 1, 1/9, 1/4. Normal equations [[Sxx, Sx], [Sx, S1]] (a, c) = (Sxy, Sy),
    # solved here by Cramer's rule in exact fractions (not the centred form fit_linear uses).
    w = [Fraction(1), Fraction(1, 9), Fraction(1, 4)]
    x, y = [1, 2, 3], [1, 3, 2]
    s1 = sum(w)
    sx = sum(wi * xi for wi, xi in zip(w, x, strict=True))
    sy = sum(wi * yi for wi, yi in zip(w, y, strict=True))
    sxx = sum(wi * xi * xi for wi, xi in zip(w, x, strict=True))
    sxy = sum(wi * xi * yi for wi, xi, yi in zip(w, x, y, strict=True))
    det = sxx * s1 - sx * sx
    a, c = (sxy * s1 - sx * sy) / det, (sxx * sy - sx * sxy) / det
    fit = fit_linear(NOISY)
    assert (fit.a_ms, fit.c_ms) == pytest.approx((float(a), float(c)), rel=1e-12)
    # It follows the small time (1 ms at n = 1) more closely than the plain fit (1.5 there).
    assert abs(fit.at(1) - 1.0) < 0.5


def test_relative_fit_keeps_small_iterations_that_plain_least_squares_gives_up() -> None:
    # 4 ms + 0.05 ms/token, but the longest "prefill" takes twice the line (quadratic
    # attention): plain least squares drags c down for it; relative errors keep c near 4.
    pts = [*line(0.05, 4.0, [1, 8, 32, 128, 512]), Point("lone", 1500, 2 * (0.05 * 1500 + 4))]
    assert fit_linear(pts).c_ms == pytest.approx(4.0, abs=1.0)
    assert fit_linear(pts, relative=False).c_ms < 1.0


def test_fit_keeps_a_and_c_non_negative() -> None:
    falling = fit_linear([Point("lone", 1, 5.0), Point("lone", 10, 4.0)], relative=False)
    assert (falling.a_ms, falling.c_ms, falling.constrained) == (0.0, 4.5, True)
    assert falling.r2 == 0.0  # the mean explains nothing
    # Relative: the weighted mean (5/25 + 4/16) / (1/25 + 1/16) = 0.45 / 0.1025.
    assert fit_linear([Point("lone", 1, 5.0), Point("lone", 10, 4.0)]).c_ms == pytest.approx(
        0.45 / 0.1025
    )
    # Through (10, 1) and (20, 3): c would be -1; the line through the origin is the fallback:
    # a = (10 + 60) / (100 + 400) = 0.14.
    origin = fit_linear([Point("lone", 10, 1.0), Point("lone", 20, 3.0)], relative=False)
    assert origin.a_ms == pytest.approx(0.14)
    assert (origin.c_ms, origin.constrained) == (0.0, True)
    assert 0.0 <= origin.r2 <= 1.0


def test_fit_needs_two_token_counts() -> None:
    with pytest.raises(ValueError, match="two or more distinct"):
        fit_linear([Point("lone", 8, 1.0), Point("decode", 8, 2.0)])


def test_points_reject_bad_values() -> None:
    with pytest.raises(ValueError, match="tokens"):
        Point("lone", 0, 1.0)
    with pytest.raises(ValueError, match="ms"):
        Point("lone", 1, math.nan)


def test_median_points_take_the_median_per_family_and_size() -> None:
    raw = [Point("lone", 8, ms) for ms in (1.0, 9.0, 2.0)] + [Point("decode", 8, 4.0)]
    assert median_points(raw) == [Point("decode", 8, 4.0), Point("lone", 8, 2.0)]


# --- saturation ---------------------------------------------------------------------------
def test_saturation_on_a_line_is_the_first_point_at_90_percent_of_the_best() -> None:
    # T = 0.05 n + 8: tokens/ms at n = 100, 1000, 1600 are 7.69, 17.24, 18.18 (the best);
    # 90% of 18.18 is 16.36, first reached at n = 1000.
    pts = line(0.05, 8.0, [1, 10, 100, 1000, 1600])
    assert saturation_point(pts) == 1000
    assert saturation_point(pts, fraction=1.0) == 1600
    assert fit_knee(fit_linear(pts)) == pytest.approx(9 * 8.0 / 0.05)  # 1440


def test_saturation_when_throughput_peaks_inside_the_ladder() -> None:
    # tokens/ms: 10, 13.3 (the best), 10: 90% of 13.3 = 12 -> 200; 70% = 9.33 -> 100.
    pts = [Point("lone", 100, 10.0), Point("lone", 200, 15.0), Point("lone", 400, 40.0)]
    assert saturation_point(pts) == 200
    assert saturation_point(pts, fraction=0.7) == 100


def test_saturation_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        saturation_point([])
    with pytest.raises(ValueError, match="fraction"):
        saturation_point(line(1, 1, [1, 2]), fraction=0)
    assert fit_knee(fit_linear([Point("lone", 1, 5.0), Point("lone", 2, 5.0)])) == math.inf


# --- ladders and the profile --------------------------------------------------------------
BENCH = Limits(
    num_blocks=48, block_size=32, max_num_seqs=64, max_batched_tokens=2048, max_model_len=1504,
    vocab=512,
)  # fmt: skip


def test_ladders_stay_within_the_engine_and_end_at_its_limits() -> None:
    lad = ladders(ProfileSpec(), BENCH)
    # 47 free blocks: 47 one-block decode requests (4 + 16 tokens) and packed prompts; a lone
    # prompt is at most 1503 tokens (max_model_len - 1).
    assert lad["decode"] == [1, 2, 4, 8, 16, 24, 32, 47]
    assert lad["packed"] == lad["decode"]
    assert lad["lone"] == [1, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1503]
    assert tokens_of("packed", 47, BENCH) == 1504 and tokens_of("lone", 9, BENCH) == 9
    assert ladders(QUICK, BENCH)["lone"] == [1, 64, 256]


def test_build_run_makes_a_loadable_profile_with_sources(tmp_path: Path) -> None:
    pts = line(0.05, 8.0, [1, 16, 256, 1024]) * 2 + line(0.05, 8.0, [4, 32], "decode")
    swap = {"blocks": 48, "bytes": 48 * 65536, "save_s": 0.002, "load_s": 0.001}
    kv = {"bytes": 48 * 65536, "num_blocks": 48, "shapes": [[48, 2, 32, 128]], "dtype": "f32"}
    m = Measurements(tuple(pts), 1, BENCH, 2048, 96, swap, kv | {"device": "CPU x"}, "test")
    run = build_run(m, ProfileSpec(), "synthetic")
    p = run.profile
    assert (p.fwd_a_ms, p.fwd_c_ms) == pytest.approx((0.05, 8.0))
    assert p.saturation_tokens == 1024  # 1024/59.2 = 17.3 tokens/ms, the best; 256/20.8 < 90%
    # The slower direction, to the 4 significant digits written.
    assert p.swap_bandwidth_bps == pytest.approx(48 * 65536 / 0.002, rel=1e-3)
    assert run.load_bps == pytest.approx(2 * run.save_bps)
    assert (p.gpu_kv_bytes, p.cpu_kv_bytes) == (48 * 32 * 2048, 96 * 32 * 2048)
    assert set(p.sources) == NUMERIC
    path = tmp_path / "synthetic.json"
    path.write_text(p.to_json())
    assert load_profile(str(path)) == p


# --- a real engine ------------------------------------------------------------------------
@pytest.mark.engine
def test_quick_profile_of_the_tiny_model(tiny_model: str, tmp_path: Path) -> None:
    from interlude.cli import app

    out = tmp_path / "tiny.json"
    args = ["profile", "--model", tiny_model, "--out", str(out), "--name", "tiny-quick"]
    args += ["--quick", "--reps", "2", "--blocks", "40", "--host-blocks", "64"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    p = load_profile(str(out))
    assert p.name == "tiny-quick"
    assert p.fwd_a_ms > 0 or p.fwd_c_ms > 0
    r2 = float(re.findall(r"R\^2 = ([0-9.]+)", p.sources["fwd_a_ms"])[0])
    assert 0.0 <= r2 <= 1.0
    assert p.swap_bandwidth_bps > 0
    # Capacities are the engine's: 40 blocks and 64 host blocks of 32 tokens x 2048 bytes.
    assert p.kv_bytes_per_token == 2048
    assert (p.block_size, p.gpu_blocks, p.cpu_blocks) == (32, 40, 64)
    assert (p.max_num_seqs, p.max_batched_tokens) == (64, 2048)
    assert set(p.sources) == NUMERIC
    assert "2048 bytes per token" in p.sources["kv_bytes_per_token"]  # the tensors agree
