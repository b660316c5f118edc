"""Dependencies point one way: the contract package `interlude.api` imports nothing but the
standard library, pydantic and itself; the gateway never imports engine code (nor vLLM or
torch); tool workers take their contracts from `interlude.api`, never from engine or gateway
code. Below the services, the libraries: the rate rules (`interlude.slo`, standard library
only), the workloads library (`interlude_workloads`, standard library only), the policies and
the simulator (no service or harness code, no process tools, whatever they reach), and the length
predictor; the HTTP load generator (`interlude.loadgen`) above them reaches no engine, gateway or
bench code. The harnesses stack as
`stack` < `bench` < `cli`. Checked statically over every module, and
dynamically by importing the gateway, the policies and the simulator."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ROOT / "services" / "interlude"
WORKLOADS = ROOT / "workloads" / "interlude_workloads"
LOADGEN = SERVICES / "loadgen"
# The folders that hold first-party packages (pyproject's `packages.find`).
SOURCE_ROOTS = tuple(ROOT / d for d in ("services", "workloads", "tools-svc", "operator"))
STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def imports(path: Path) -> set[str]:
    """Every module a file imports (absolute names; relative imports are not used here)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def module_file(name: str) -> Path | None:
    """The file that importing first-party module `name` runs, or None (not a first-party
    module: the standard library, a third party, or a name defined inside a module)."""
    for root in SOURCE_ROOTS:
        base = root.joinpath(*name.split("."))
        for f in (base.with_suffix(".py"), base / "__init__.py"):
            if f.is_file():
                return f
    return None


def reached(files: Iterable[Path]) -> dict[str, set[str]]:
    """{module: the files that import it} over `files` and every first-party module they reach.

    Follows imports to their files, parents included (importing `a.b.c` runs `a/__init__.py`
    and `a/b/__init__.py`) and `from a.b import c` into `a/b/c.py` where `c` is a module.
    Imports inside functions and under TYPE_CHECKING count: a lazy import is still an arrow.
    """
    found: dict[str, set[str]] = {}
    todo, done = list(files), set[Path]()
    while todo:
        f = todo.pop()
        if f in done:
            continue
        done.add(f)
        tree = ast.parse(f.read_text(), str(f))
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
                names |= {
                    f"{node.module}.{a.name}"
                    for a in node.names
                    if module_file(f"{node.module}.{a.name}") is not None
                }
        for name in names:
            shown = f.relative_to(ROOT) if f.is_relative_to(ROOT) else Path(f.name)
            found.setdefault(name, set()).add(shown.as_posix())
            parts = name.split(".")
            todo += [g for i in range(len(parts)) if (g := module_file(".".join(parts[: i + 1])))]
    return found


def under(module: str, prefixes: Iterable[str]) -> bool:
    """Whether `module` is one of `prefixes` or inside one (`a.b` is under `a`, `a.bc` is not)."""
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def reaching(files: Iterable[Path], forbidden: Iterable[str]) -> dict[str, list[str]]:
    """{forbidden module reached: the files that import it}, for the ones reached."""
    banned = tuple(forbidden)
    return {m: sorted(fs) for m, fs in reached(files).items() if under(m, banned)}


def offenders(
    files: list[Path], allowed: Callable[[str], bool], root: Path = ROOT
) -> dict[str, list[str]]:
    """{file: the modules it imports that `allowed` refuses}, for the files that have any."""
    found: dict[str, list[str]] = {}
    for f in files:
        bad = sorted(m for m in imports(f) if not allowed(m))
        if bad:
            found[str(f.relative_to(root))] = bad
    return found


def _top(module: str) -> str:
    return module.split(".")[0]


def test_the_contract_package_imports_only_stdlib_pydantic_and_itself() -> None:
    files = sorted((SERVICES / "api").rglob("*.py"))
    assert len(files) >= 8

    def allowed(m: str) -> bool:
        return _top(m) in STDLIB | {"pydantic"} or m.startswith("interlude.api")

    assert offenders(files, allowed) == {}


ENGINE_SIDE = ("interlude.engine", "interlude.enginecore", "vllm", "torch")
# What measures and starts the services: above every service, imported by none.
HARNESSES = ("interlude.bench", "interlude.cli", "interlude.stack")


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        (SERVICES / "gateway", (*ENGINE_SIDE, "interlude.picker", *HARNESSES)),
        (SERVICES / "picker", (*ENGINE_SIDE, *HARNESSES)),
        (ROOT / "tools-svc" / "interlude_tools", (*ENGINE_SIDE, "interlude.gateway")),
        (SERVICES / "engine", ("interlude.gateway", "interlude.picker", *HARNESSES)),
        (SERVICES / "enginecore", ("interlude.gateway", "interlude.engine.", *HARNESSES)),
        # The operator reads the engines over HTTP and Prometheus: of Interlude it takes the
        # contracts (`api.cluster`) and the pure flip rule (`policy.flips`), no service code.
        (
            ROOT / "operator" / "interlude_operator",
            (
                *ENGINE_SIDE,
                "interlude.gateway",
                "interlude.picker",
                "interlude.bus",
                "interlude_tools",
                *HARNESSES,
            ),
        ),
        # Both halves of the tool bus sit below the processes that use them.
        (
            SERVICES / "bus",
            (*ENGINE_SIDE, "interlude.gateway", "interlude.picker", "interlude_tools", *HARNESSES),
        ),
    ],
)
def test_no_module_imports_across_the_line(folder: Path, forbidden: tuple[str, ...]) -> None:
    files = sorted(folder.rglob("*.py"))
    assert files

    def allowed(m: str) -> bool:
        return not any(m == f.rstrip(".") or m.startswith(f.rstrip(".") + ".") for f in forbidden)

    assert offenders(files, allowed) == {}


def loaded(imports: str, bad: str) -> str:
    """The modules a fresh interpreter holds after `import imports` for which the expression
    `bad` (over the module name `m`) is true, comma-separated."""
    probe = f"import sys, {imports}; print(','.join(sorted(m for m in sys.modules if {bad})))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_importing_the_gateway_or_the_picker_loads_no_engine_code() -> None:
    engine = (
        "m.split('.')[0] in ('vllm', 'torch')"
        " or m.startswith(('interlude.engine', 'interlude.enginecore'))"
    )
    fronts = "interlude.gateway.app, interlude.cli.gateway, interlude.picker.server"
    assert loaded(fronts, engine) == ""


def test_the_offender_finder_sees_a_forbidden_import(tmp_path: Path) -> None:
    """The check itself can fail: a file importing engine code is reported."""
    (tmp_path / "bad.py").write_text("from interlude.engine.chat import ChatRunner\nimport json\n")
    found = offenders(
        [tmp_path / "bad.py"], lambda m: not m.startswith("interlude.engine"), root=tmp_path
    )
    assert found == {"bad.py": ["interlude.engine.chat"]}


# --- the libraries under the services ----------------------------------------------------------

# What no library may reach: the engine's and the services' stacks, and every harness.
SERVICE_AND_HARNESS = (
    *ENGINE_SIDE,
    "httpx",
    "redis",
    "fastapi",
    "interlude.gateway",
    "interlude.picker",
    "interlude.bus",
    "interlude.bench",
    "interlude.stack",
    "interlude.loadgen",
)
# What building or running the mypyc build needs, and a policy or a simulation never does:
# processes, pools, temporary trees.
PROCESS_TOOLS = ("subprocess", "multiprocessing", "concurrent", "tempfile", "shutil")


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        # The policies sit under the simulator and the workloads: the engine runs them too.
        ("policy", (*SERVICE_AND_HARNESS, *PROCESS_TOOLS, "interlude.sim", "interlude_workloads")),
        ("sim", (*SERVICE_AND_HARNESS, *PROCESS_TOOLS)),
        # TetriInfer's length predictor is a library the harness (`interlude predictor`) drives;
        # it learns from the workload traces and knows nothing of the policies that may consume it.
        ("lengthpred", (*SERVICE_AND_HARNESS, *PROCESS_TOOLS, "interlude.sim", "interlude.policy")),
    ],
)
def test_the_libraries_reach_no_service_harness_or_process_code(
    package: str, forbidden: tuple[str, ...]
) -> None:
    files = sorted((SERVICES / package).rglob("*.py"))
    assert len(files) >= 5
    assert reaching(files, forbidden) == {}


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        # The harnesses stack up too: `stack` starts processes, `bench` measures through it,
        # `cli` parses commands over both. Each imports only those under it (the CLI appears
        # below only as a command line, `python -m interlude.cli`, never as an import).
        ("stack", ("interlude.bench", "interlude.cli")),
        ("bench", ("interlude.cli",)),
    ],
)
def test_the_harnesses_import_only_those_below_them(
    package: str, forbidden: tuple[str, ...]
) -> None:
    files = sorted((SERVICES / package).rglob("*.py"))
    assert files
    assert reaching(files, forbidden) == {}


def test_the_compiled_hook_imports_only_the_standard_library_env_and_mypy() -> None:
    """`interlude.compiled` runs first in every process that imports the policies (the engine,
    the operator): the build tool (compilers, processes, the workloads) lives in the bench."""

    def allowed(m: str) -> bool:
        return (_top(m) in STDLIB and not under(m, PROCESS_TOOLS)) or m in (
            "interlude.env",
            "mypy.version",
        )

    assert offenders([SERVICES / "compiled.py"], allowed) == {}


def test_the_rate_rules_import_only_the_standard_library() -> None:
    """The SLO and sustainable-rate rules judge the simulator's, the engine's and the HTTP
    load generator's sweeps alike, so they sit under all three."""
    assert offenders([SERVICES / "slo.py"], lambda m: _top(m) in STDLIB) == {}


def test_the_workload_library_imports_only_the_standard_library_and_itself() -> None:
    """The simulator imports the workload and trace types: they must not reach back up (into
    `interlude`, the HTTP load generator `interlude.loadgen` included)."""
    files = sorted(WORKLOADS.rglob("*.py"))
    assert len(files) >= 5

    def allowed(m: str) -> bool:
        return _top(m) in STDLIB or under(m, ("interlude_workloads",))

    assert offenders(files, allowed) == {}
    assert reaching(files, ("interlude",)) == {}


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        # The load generator is a harness over the libraries, not over the engine or the bench
        # (which sit above it and drive it).
        (LOADGEN, (*ENGINE_SIDE, "interlude.gateway", "interlude.picker", "interlude.bench")),
        # Tool pods use the workloads' tables (the simulated models' latencies), nothing
        # of the load generator, the simulator or the bench.
        (
            ROOT / "tools-svc" / "interlude_tools",
            ("interlude.loadgen", "interlude.sim", "interlude.bench", "interlude.stack"),
        ),
    ],
)
def test_no_module_reaches_across_the_line(folder: Path, forbidden: tuple[str, ...]) -> None:
    files = sorted(folder.rglob("*.py"))
    assert files
    assert reaching(files, forbidden) == {}


def test_importing_the_policies_or_the_simulator_loads_no_service_or_process_code() -> None:
    banned = (
        f"any(m == b or m.startswith(b + '.') for b in {SERVICE_AND_HARNESS + PROCESS_TOOLS!r})"
    )
    assert loaded("interlude.policy, interlude.sim", banned) == ""


def test_the_reach_finder_follows_imports_into_first_party_modules(tmp_path: Path) -> None:
    """The check itself can fail: a module reached through another one, from inside a
    function, is reported with the file that imports it."""
    (tmp_path / "lazy.py").write_text("def f():\n    from interlude.bench.sweep import run_sweep\n")
    found = reaching([tmp_path / "lazy.py"], ("interlude.sim.simulator", "interlude.bench"))
    assert "services/interlude/bench/sweep.py" in found["interlude.sim.simulator"]
    assert "lazy.py" in found["interlude.bench.sweep"]
    assert reaching([tmp_path / "lazy.py"], ("vllm",)) == {}


def test_no_harness_runs_a_streaming_loop_of_its_own() -> None:
    """Benchmarks measure the loop that serves users: scripted runs go through the engine's
    `ChatRunner`, so no harness module calls vLLM's `generate` or builds a `StreamingInput`."""
    harness = [SERVICES / h.split(".")[1] for h in HARNESSES]
    found = {
        str(f.relative_to(ROOT))
        for folder in harness
        for f in folder.rglob("*.py")
        for node in ast.walk(ast.parse(f.read_text()))
        if (isinstance(node, ast.Attribute) and node.attr == "generate")
        or (isinstance(node, ast.Name) and node.id == "StreamingInput")
    }
    assert found == set()
