"""The `interlude` command line, through typer's test runner."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from interlude.bench.sweep import POINT_FIELDS, skipped_point
from interlude.cli import app
from interlude.policy import POLICIES, available_profiles

runner = CliRunner()
Flat = Callable[[str], str]


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
    args += ["--rates", "0.5,1", "--duration", "30", "--workers", "1", "--full"]
    out_md = tmp_path / "table.md"
    args += ["--json", str(out_json), "--plot", str(out_png), "--markdown", str(out_md)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    result = json.loads(out_json.read_text())
    assert list(result["policies"]) == ["vllm", "preserve"]
    assert result["rates"] == [0.5, 1.0]
    assert "slo_normalized_latency" in result and result["full"] is True
    assert out_png.read_bytes()[:8] == PNG_SIGNATURE
    assert "preserve" in res.output and "wrote" in res.output
    # The Markdown table: a header, a separator, and one row per policy in sweep order.
    lines = out_md.read_text().splitlines()
    assert lines[0].startswith(
        "| policy | sustainable req/s median | x vllm | sustainable req/s tail | x vllm (tail) |"
    )
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["vllm", "preserve"]
    # `bench report` shows the saved sweep again: the same Markdown, and a redrawn plot.
    again = tmp_path / "again.png"
    res = runner.invoke(
        app, ["bench", "report", str(out_json), "--markdown", "--at", "1", "--plot", str(again)]
    )
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[: len(lines)] == lines
    assert again.read_bytes()[:8] == PNG_SIGNATURE


def table_rows(output: str) -> dict[str, list[str]]:
    """A Markdown table's cells after the policy's name, by policy."""
    rows = [line.split("|")[1:-1] for line in output.splitlines() if line.startswith("|")]
    return {r[0].strip(): [c.strip() for c in r[1:]] for r in rows}


def saved_point(rate: float, median: float, p99: float) -> dict[str, Any]:
    return {
        **dict.fromkeys(POINT_FIELDS, 1.0),  # positive: the plot's axes are logarithmic
        "unfinished_fraction": 0.0,
        "rate": rate,
        "normalized_latency_median": median,
        "normalized_latency_p99": p99,
        "skipped": False,
    }


def saved_sweep() -> dict[str, Any]:
    """A small sweep result as `bench sim --json` writes it, with skipped points."""
    slo = 0.03
    return {
        "workload": "generated:mixed",
        "profile": "gptj-6b-a100-40g",
        "duration_s": 60.0,
        "seed": 0,
        "rates": [1.0, 2.0, 3.0, 4.0],
        "slo_normalized_latency": slo,
        "tail_slo_normalized_latency": 10 * slo,
        "max_unfinished_fraction": 0.01,
        "full": False,
        "policies": {
            "vllm": {
                "sustainable_rate_median": 1.0,
                "sustainable_rate_tail": 1.0,
                "points": [
                    saved_point(1.0, 0.01, 0.02),
                    saved_point(2.0, 0.1, 0.5),
                    saved_point(3.0, 0.2, 0.9),
                    skipped_point(4.0),
                ],
            },
            "interlude": {
                "sustainable_rate_median": 4.0,
                "sustainable_rate_tail": 2.0,
                "points": [
                    saved_point(1.0, 0.01, 0.02),
                    saved_point(2.0, 0.01, 0.2),
                    saved_point(3.0, 0.02, 0.4),
                    saved_point(4.0, 0.02, 0.5),
                ],
            },
        },
    }


def test_bench_report_shows_both_rates_and_skipped_points(tmp_path: Path) -> None:
    saved = tmp_path / "sweep.json"
    saved.write_text(json.dumps(saved_sweep()))
    png = tmp_path / "sweep.png"
    res = runner.invoke(
        app, ["bench", "report", str(saved), "--markdown", "--at", "4", "--plot", str(png)]
    )
    assert res.exit_code == 0, res.output
    rows = table_rows(res.output)
    # median rate, x vllm, tail rate, x vllm (tail), then the details at 4 req/s.
    assert rows["vllm"][:5] == ["1", "1.00", "1", "1.00", "skipped"]
    assert rows["interlude"][:6] == [
        "4",
        "4.00",
        "2",
        "2.00",
        "20.0 / 500.0",
        "0.0 %",
    ]
    assert png.read_bytes()[:8] == PNG_SIGNATURE  # the plot leaves the skipped point out


def test_bench_report_reads_a_sweep_saved_before_the_tail_rule(tmp_path: Path) -> None:
    old = saved_sweep()
    for key in ("tail_slo_normalized_latency", "max_unfinished_fraction", "full"):
        del old[key]
    old["policies"]["vllm"]["points"][-1] = saved_point(4.0, 0.3, 1.0)  # no skipping then
    for entry in old["policies"].values():
        entry["sustainable_rate"] = entry.pop("sustainable_rate_median")
        del entry["sustainable_rate_tail"]
        for p in entry["points"]:
            for key in ("skipped", "unfinished", "unfinished_fraction"):
                del p[key]
    saved = tmp_path / "old.json"
    saved.write_text(json.dumps(old))
    res = runner.invoke(app, ["bench", "report", str(saved), "--markdown", "--at", "2"])
    assert res.exit_code == 0, res.output
    rows = table_rows(res.output)
    # The median rate is the old `sustainable_rate`; the tail rate and unfinished are unknown.
    assert rows["interlude"][:6] == [
        "4",
        "4.00",
        "-",
        "-",
        "10.0 / 200.0",
        "-",
    ]


def test_bench_report_rejects_a_file_that_is_no_sweep(tmp_path: Path, flat: Flat) -> None:
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
def test_bench_sim_bad_input_is_a_usage_error(
    option: str, value: str, message: str, flat: Flat
) -> None:
    res = runner.invoke(app, ["bench", "sim", "--workers", "1", "--duration", "5", option, value])
    assert res.exit_code == 2  # click's usage error, not a crash (1)
    assert isinstance(res.exception, SystemExit)
    assert message in flat(res.output)
    assert "Traceback" not in res.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rates", "fast"], "bad rates 'fast'"),
        (["--arms", "vllm-prefix,fifo"], "unknown arms ['fifo']"),
        (["--rates", "1,2", "--arms", "interlude"], "a sweep needs 'vllm-noprefix'"),
    ],
)
def test_bench_engine_bad_input_is_a_usage_error(
    tmp_path: Path, args: list[str], message: str, flat: Flat
) -> None:
    """Checked before any engine starts (or a model is built)."""
    res = runner.invoke(app, ["bench", "engine", "--json", str(tmp_path / "e.json"), *args])
    assert res.exit_code == 2
    assert message in flat(res.output)
    assert not (tmp_path / "e.json").exists()


def test_bench_bound_prints_both_bounds_and_refuses_an_unknown_workload(flat: Flat) -> None:
    res = runner.invoke(app, ["bench", "bound", "--workload", "generated:toolbench"])
    assert res.exit_code == 0, res.output
    found = re.findall(
        r"sustains (\d+\.\d+) req/s \(work and memory\), (\d+\.\d+) req/s \(with the calls\),"
        r" (\d+\.\d+) req/s \(with the calls and the host's memory\)",
        flat(res.output),
    )
    assert found, res.output
    alone, with_calls, with_host = map(float, found[0])
    assert 0 < with_host <= with_calls < alone  # the calls cost something on this mix
    bad = runner.invoke(app, ["bench", "bound", "--workload", "generated:nope"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output


@pytest.mark.parametrize(
    ("command", "args", "rows"),
    [
        (["bench", "pd"], ["--loads", "0.3", "--rounds", "1", "--duration", "5"], 4),
        (["bench", "placement"], ["--rates", "4", "--rounds", "1", "--duration", "5"], 5),
    ],
)
def test_the_cluster_benchmarks_write_json_a_plot_and_a_table(
    tmp_path: Path, command: list[str], args: list[str], rows: int
) -> None:
    out = tmp_path / "result.json"
    res = runner.invoke(app, [*command, "--json", str(out), *args])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["rows"] and out.with_suffix(".png").stat().st_size > 0
    assert len([line for line in res.output.splitlines() if line.startswith("| ")]) == 1 + rows
