"""The mypyc-compiled simulator: keyed to its sources, used only when asked, same results."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from interlude import compiled
from interlude.bench import compiled_build
from interlude.bench.sweep import POINT_FIELDS, SweepSpec, run_sweep
from interlude.env import Env

PROFILE = "gptj-6b-a100-40g"


def test_every_compiled_module_exists_and_none_is_a_package_init() -> None:
    paths = compiled_build.sources()
    assert paths and all(p.is_file() for p in paths)
    assert not any(p.name in ("__init__.py", "request.py", "profile.py") for p in paths)


@pytest.mark.parametrize("edited", ["sim/ranked_queue.py", "sim/request.py", "policy/profile.py"])
def test_the_digest_changes_with_any_module_of_the_two_packages(
    tmp_path: Path, edited: str
) -> None:
    root = tmp_path / "interlude"
    for pkg in compiled.MODULES:
        shutil.copytree(compiled.PACKAGE_ROOT / pkg, root / pkg)
    before = compiled.digest(root)
    assert before == compiled.digest(compiled.PACKAGE_ROOT)
    path = root / edited
    path.write_text(path.read_text() + "\n# an edit\n")
    assert compiled.digest(root) != before


def test_the_digest_changes_with_which_modules_are_compiled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A module newly compiled (a policy subclassing a compiled one must be) needs a new
    build: the old one lacks it, and the Python subclass cannot load against it."""
    before = compiled.digest()
    fewer = {pkg: names[:-1] for pkg, names in compiled.MODULES.items()}
    monkeypatch.setattr(compiled, "MODULES", fewer)
    assert compiled.digest() != before


def test_every_policy_variant_is_compiled_with_the_policy_it_changes() -> None:
    assert "variants" in compiled.MODULES["policy"]


def test_the_mode_is_checked() -> None:
    assert Env().sim_compiled == "auto"
    with pytest.raises(ValueError, match="SIM_COMPILED must be auto, on or off"):
        Env(sim_compiled="yes")


def test_without_a_matching_build_on_runs_pure_python(tmp_path: Path) -> None:
    # A fresh interpreter: this one imported the packages already.
    env = {"INTERLUDE_SIM_COMPILED": "on", "INTERLUDE_COMPILED_DIR": str(tmp_path), "PATH": ""}
    code = "from interlude.bench.compiled_build import is_active; print(is_active())"
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert run.stdout.strip() == "False"
    assert run.stderr.count("no compiled build matches the sources") == 1  # said once


def test_this_process_imports_pure_python() -> None:
    # conftest sets "off"; the engine, which never sets the variable, gets "auto" and likewise
    # imports pure Python (only `bench sim`'s workers are told "on").
    assert compiled.mode() == "off" and not compiled_build.is_active()


def test_bench_sim_on_a_build_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from interlude.cli.sim import _use_compiled

    monkeypatch.setenv("INTERLUDE_SIM_COMPILED", "off")
    assert _use_compiled() is False
    monkeypatch.setenv("INTERLUDE_SIM_COMPILED", "auto")
    assert _use_compiled() is (compiled.build_dir() is not None)


SPAWN = """
import multiprocessing

import interlude.sim
from interlude.bench.compiled_build import is_active


def child() -> bool:
    from interlude.policy import load_profile

    load_profile("gptj-6b-a100-40g")
    return is_active()


if __name__ == "__main__":
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        print(is_active(), pool.apply(child))
"""


@pytest.mark.slow
def test_a_compiled_sweep_gives_the_pure_sweeps_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INTERLUDE_COMPILED_DIR", str(tmp_path))
    assert compiled.build_dir() is None
    built = compiled_build.build()  # mypyc and gcc, for real: about 40 CPU-seconds
    assert compiled.build_dir() == built
    assert compiled_build.build() == built  # a matching build is reused
    # A process on the build spawns workers that import with its sys.path (`bench sim` with
    # INTERLUDE_SIM_COMPILED=on): they must find the package, and the build too.
    script = tmp_path / "spawn.py"
    script.write_text(SPAWN)
    env = {"INTERLUDE_SIM_COMPILED": "on", "INTERLUDE_COMPILED_DIR": str(tmp_path), "PATH": ""}
    run = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["True", "True"]
    policies = ("vllm", "infercept", "lamps", "continuum", "thunderagent", "interlude")
    spec = SweepSpec("generated:mixed", PROFILE, policies, (1.0, 3.0), 300.0, workers=2, full=True)
    pure = run_sweep(spec)
    fast = run_sweep(SweepSpec(**{**spec.__dict__, "compiled": True}))
    # The sweep checks that every point ran as asked (compiled in the workers, pure here).
    assert (pure["compiled"], fast["compiled"]) == (False, True)
    for pol in policies:
        for a, b in zip(
            pure["policies"][pol]["points"], fast["policies"][pol]["points"], strict=True
        ):
            assert a["finished"] > 0
            assert {k: a[k] for k in POINT_FIELDS if k != "wall_s"} == {
                k: b[k] for k in POINT_FIELDS if k != "wall_s"
            }
        assert (
            pure["policies"][pol]["sustainable_rate_tail"]
            == (fast["policies"][pol]["sustainable_rate_tail"])
        )
