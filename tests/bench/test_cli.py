"""The `interlude` command line, through typer's test runner."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from interlude.cli import app
from interlude.policy import POLICIES, available_profiles

runner = CliRunner()
# typer's rich error panel wraps its text to the terminal's width and draws a box around it.
_BOX = re.compile(r"[\u2500-\u257f]")


def flat(output: str) -> str:
    """The output as one line of words: the same at any terminal width."""
    return " ".join(_BOX.sub(" ", output).split())


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
    out_md = tmp_path / "table.md"
    args += ["--json", str(out_json), "--plot", str(out_png), "--markdown", str(out_md)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    result = json.loads(out_json.read_text())
    assert list(result["policies"]) == ["vllm", "preserve"]
    assert result["rates"] == [0.5, 1.0]
    assert "slo_normalized_latency" in result
    assert out_png.read_bytes()[:8] == PNG_SIGNATURE
    assert "preserve" in res.output and "wrote" in res.output
    # The Markdown table: a header, a separator, and one row per policy in sweep order.
    lines = out_md.read_text().splitlines()
    assert lines[0].startswith("| policy | sustainable req/s |")
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["vllm", "preserve"]
    # `bench report` shows the saved sweep again: the same Markdown, and a redrawn plot.
    again = tmp_path / "again.png"
    res = runner.invoke(
        app, ["bench", "report", str(out_json), "--markdown", "--at", "1", "--plot", str(again)]
    )
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[: len(lines)] == lines
    assert again.read_bytes()[:8] == PNG_SIGNATURE


def test_bench_report_rejects_a_file_that_is_no_sweep(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.json"
    bogus.write_text('{"not": "a sweep"}')
    res = runner.invoke(app, ["bench", "report", str(bogus)])
    assert res.exit_code == 2
    assert "not a sweep result" in flat(res.output)
    assert "Traceback" not in res.output


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
    assert message in flat(res.output)
    assert "Traceback" not in res.output
