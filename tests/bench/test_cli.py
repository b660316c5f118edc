"""The `interlude` command line, through typer's test runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from interlude.cli import app
from interlude.policy import POLICIES, available_profiles

runner = CliRunner()
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_profiles_and_policies_commands() -> None:
    res = runner.invoke(app, ["profiles"])
    assert res.exit_code == 0
    assert all(name in res.output for name in available_profiles())
    res = runner.invoke(app, ["policies"])
    assert res.exit_code == 0
    assert all(name in res.output for name in POLICIES)


@pytest.mark.slow
def test_bench_sim_writes_json_and_plot(tmp_path: Path) -> None:
    out_json, out_png = tmp_path / "out" / "sweep.json", tmp_path / "plots" / "sweep.png"
    args = ["bench", "sim", "--workload", "generated:mixed", "--policies", "vllm,preserve"]
    args += ["--rates", "0.5,1", "--duration", "30", "--workers", "1"]
    args += ["--json", str(out_json), "--plot", str(out_png)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    result = json.loads(out_json.read_text())
    assert list(result["policies"]) == ["vllm", "preserve"]
    assert result["rates"] == [0.5, 1.0]
    assert "slo_normalized_latency" in result
    assert out_png.read_bytes()[:8] == PNG_SIGNATURE
    assert "preserve" in res.output and "wrote" in res.output


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--rates", "fast", "bad rates 'fast'"),
        ("--rates", "2:1:1", "bad rates '2:1:1'"),
        ("--policies", "vllm,fifo", "unknown policy 'fifo'"),
        ("--profile", "nope", "unknown profile 'nope'"),
        ("--workload", "generated:nope", "unknown generated workload 'nope'"),
    ],
)
def test_bench_sim_bad_input_is_a_usage_error(option: str, value: str, message: str) -> None:
    res = runner.invoke(app, ["bench", "sim", "--workers", "1", "--duration", "5", option, value])
    assert res.exit_code == 2  # click's usage error, not a crash (1)
    assert isinstance(res.exception, SystemExit)
    assert message in res.output
    assert "Traceback" not in res.output
