"""Dependencies point one way: the contract package `interlude.api` imports nothing but the
standard library, pydantic and itself; the gateway never imports engine code (nor vLLM or
torch); tool workers take their contracts from `interlude.api`, never from engine or gateway
code. Checked statically over every module, and dynamically by importing the gateway."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ROOT / "services" / "interlude"
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


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        (SERVICES / "gateway", (*ENGINE_SIDE, "interlude.picker")),
        (SERVICES / "picker", ENGINE_SIDE),
        (ROOT / "tools-svc" / "interlude_tools", (*ENGINE_SIDE, "interlude.gateway")),
        (SERVICES / "engine", ("interlude.gateway", "interlude.picker")),
        (SERVICES / "enginecore", ("interlude.gateway", "interlude.engine.")),
    ],
)
def test_no_module_imports_across_the_line(folder: Path, forbidden: tuple[str, ...]) -> None:
    files = sorted(folder.rglob("*.py"))
    assert files

    def allowed(m: str) -> bool:
        return not any(m == f.rstrip(".") or m.startswith(f.rstrip(".") + ".") for f in forbidden)

    assert offenders(files, allowed) == {}


def test_importing_the_gateway_or_the_picker_loads_no_engine_code() -> None:
    probe = (
        "import sys, interlude.gateway.app, interlude.gateway_cli, interlude.picker.server;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch')"
        " or m.startswith(('interlude.engine', 'interlude.enginecore')));"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_offender_finder_sees_a_forbidden_import(tmp_path: Path) -> None:
    """The check itself can fail: a file importing engine code is reported."""
    (tmp_path / "bad.py").write_text("from interlude.engine.chat import ChatRunner\nimport json\n")
    found = offenders(
        [tmp_path / "bad.py"], lambda m: not m.startswith("interlude.engine"), root=tmp_path
    )
    assert found == {"bad.py": ["interlude.engine.chat"]}
