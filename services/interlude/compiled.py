"""Which build of the simulator and the policies a process imports: the mypyc one or the .py files.

mypyc compiles the simulator's and the policies' modules, as written and type-checked, into C
extensions, about 1.6x faster (`interlude.bench.compiled_build` makes a build; no second
implementation exists to drift). A build is keyed by a digest of every module of the two
packages, Python's version and mypyc's, so an edited source never runs stale code: its digest
names no build, and the pure-Python modules run.

Who uses a build (`INTERLUDE_SIM_COMPILED`, read through `interlude.env`):
* `auto` (default): `interlude bench sim` runs its points on the build that matches the sources,
  if there is one; every other process (the engine above all) imports pure Python.
* `on`: `bench sim` builds one first if none matches; any process importing `interlude.sim` or
  `interlude.policy` with `on` set uses a matching build (the sweep's workers get `on`).
* `off`: never.

This is the half that `interlude.policy` and `interlude.sim` import first thing, so it stays
small and low: the standard library, `interlude.env` and (for the digest, where installed)
mypy's version; no subprocess, no simulator, no workloads (tests/test_layering.py). Side
effects: `activate` changes a package's `__path__` and appends the build's support folder to
`sys.path`, nothing else; nothing here writes.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from collections.abc import MutableSequence
from pathlib import Path

from interlude.env import load_env

PACKAGE_ROOT = Path(__file__).resolve().parent  # services/interlude
# The modules compiled, by package. Left out: the packages' __init__ (they call `activate`);
# sim/request.py, whose requests change class while decoding (`DecodingRequest`), which
# mypyc's native classes cannot do; policy/profile.py, which finds its data files beside it.
MODULES: dict[str, tuple[str, ...]] = {
    "sim": (
        "accounting",
        "batch",
        "config",
        "integrity",
        "kv",
        "metrics",
        "order",
        "prefix_cache",
        "ranked_queue",
        "running",
        "simulator",
        "skip",
        "swapping",
    ),
    "policy": (
        "admission",
        "area",
        "base",
        "baselines",
        "batching",
        "continuum",
        "infercept",
        "interlude_config",
        "interlude_policy",
        "lamps",
        "lamps_keys",
        "predict",
        "ranking",
        "rekeyed",
        "slots",
        "starvation",
        "thunderagent",
        "types",
        "variants",  # subclasses of compiled policies must be compiled too
        "waste",
    ),
}
VARIABLE = "INTERLUDE_SIM_COMPILED"
# A build keeps mypyc's shared support module (imported by its top-level name, so its folder
# goes on sys.path) apart from the package tree: a folder on sys.path holding an `interlude`
# directory would make a spawned worker, which imports with its parent's sys.path, take that
# directory for the whole `interlude` package (a namespace package of extensions only).
SUPPORT, TREE = "support", "tree"
_LAYOUT = "layout 2: support/ and tree/"
_digest: str | None = None
_warned = False


def digest(root: Path = PACKAGE_ROOT) -> str:
    """What a build must match: this Python, this mypyc, which modules are compiled, and every
    module of the two packages (the compiled ones, and the Python ones they were type-checked
    against)."""
    from mypy.version import __version__ as mypy_version

    h = hashlib.sha256(f"{sys.version}|{sysconfig.get_platform()}|{mypy_version}".encode())
    h.update(repr(sorted(MODULES.items())).encode())  # which of them are compiled
    h.update(_LAYOUT.encode())
    for path in sorted(p for pkg in MODULES for p in (root / pkg).glob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:20]


def _current_digest() -> str:
    global _digest
    if _digest is None:
        _digest = digest()
    return _digest


def mode() -> str:
    """`INTERLUDE_SIM_COMPILED`: auto, on or off (`Env` checks the value)."""
    return load_env().sim_compiled


def cache_dir() -> Path:
    configured = load_env().compiled_dir
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "interlude" / "compiled"


def target_dir() -> Path:
    """Where the build that matches the sources lives, whether it is there yet or not
    (ImportError without mypy: no build can be named)."""
    return cache_dir() / _current_digest()


def build_dir() -> Path | None:
    """The build that matches the sources, or None."""
    try:
        found = target_dir()
    except ImportError:  # no mypy here (a runtime image): no build can match
        return None
    return found if (found / "complete").is_file() else None


def activate(package: str, path: MutableSequence[str]) -> bool:
    """Called first thing by `interlude.sim` and `interlude.policy`: with mode `on` and a build
    that matches the sources, put the build's copy of `package` ahead on `path` (the package's
    `__path__`), so its compiled modules load instead of the .py files. Returns whether it did."""
    global _warned
    # Every process imports these packages: the usual case costs one look-up (`Env` checks the
    # value where it matters, in `bench sim`).
    if os.environ.get(VARIABLE) != "on":
        return False
    found = build_dir()
    if found is None:
        if _warned:
            return False
        _warned = True
        print(
            "interlude: INTERLUDE_SIM_COMPILED=on but no compiled build matches the sources; "
            "running pure Python (build one: interlude bench compile)",
            file=sys.stderr,
        )
        return False
    # The extensions share one support module, imported by its top-level name.
    support = str(found / SUPPORT)
    if support not in sys.path:
        sys.path.append(support)
    path.insert(0, str(found / TREE / "interlude" / package.rpartition(".")[2]))
    return True
