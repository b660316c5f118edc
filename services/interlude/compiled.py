"""The simulator and the policies compiled to C by mypyc: the same source, about 1.6x faster.

A rate sweep spends its time in Python loops over requests (the simulator's step, the policies'
decisions). mypyc compiles those modules, as written and type-checked, into C extensions; no
second implementation exists to drift. A build is keyed by a digest of every module of the
two packages, Python's version and mypyc's, so an edited source never runs stale code: its
digest names no build, and the pure-Python modules run.

Who uses a build (`INTERLUDE_SIM_COMPILED`, read through `interlude.env`):
* `auto` (default): `interlude bench sim` runs its points on the build that matches the sources,
  if there is one; every other process (the engine above all) imports pure Python.
* `on`: `bench sim` builds one first if none matches; any process importing `interlude.sim` or
  `interlude.policy` with `on` set uses a matching build (the sweep's workers get `on`).
* `off`: never.

Side effects: `build` runs mypyc and a C compiler in a temporary copy of the package and writes
only under the cache directory (`INTERLUDE_COMPILED_DIR`, default `~/.cache/interlude/compiled`);
`activate` changes a package's `__path__` and appends the build's support folder to `sys.path`,
nothing else.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator, MutableSequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from multiprocessing import get_context
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
        "engine",
        "integrity",
        "kv",
        "metrics",
        "order",
        "queue",
        "running",
        "skip",
        "swapping",
    ),
    "policy": (
        "admission",
        "base",
        "baselines",
        "batching",
        "continuum",
        "infercept",
        "interlude_policy",
        "lamps",
        "lamps_keys",
        "predict",
        "ranking",
        "starvation",
        "thunderagent",
        "types",
        "variants",  # subclasses of compiled policies must be compiled too
        "waste",
    ),
}
_VARIABLE = "INTERLUDE_SIM_COMPILED"
# A build keeps mypyc's shared support module (imported by its top-level name, so its folder
# goes on sys.path) apart from the package tree: a folder on sys.path holding an `interlude`
# directory would make a spawned worker, which imports with its parent's sys.path, take that
# directory for the whole `interlude` package (a namespace package of extensions only).
_SUPPORT, _TREE = "support", "tree"
_LAYOUT = "layout 2: support/ and tree/"
_digest: str | None = None
_warned = False


class BuildError(RuntimeError):
    """mypyc or the C compiler failed; the message holds the end of their output."""


def sources(root: Path = PACKAGE_ROOT) -> list[Path]:
    return [root / pkg / f"{name}.py" for pkg, names in MODULES.items() for name in names]


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


def build_dir() -> Path | None:
    """The build that matches the sources, or None."""
    try:
        found = cache_dir() / _current_digest()
    except ImportError:  # no mypy here (a runtime image): no build can match
        return None
    return found if (found / "complete").is_file() else None


def build() -> Path:
    """Compile `MODULES` unless a matching build exists; return the build's directory.

    mypyc writes next to the sources it compiles, so it runs in a copy of the package; the
    extensions then move to the cache. Takes about 40 CPU-seconds.
    """
    found = build_dir()
    if found is not None:
        return found
    target = cache_dir() / _current_digest()
    with tempfile.TemporaryDirectory(prefix="interlude-mypyc-") as tmp:
        work = Path(tmp)
        ignore = shutil.ignore_patterns("__pycache__", "*.so", ".mypy_cache")
        shutil.copytree(PACKAGE_ROOT, work / "interlude", ignore=ignore)
        import interlude_loadgen

        loadgen = Path(interlude_loadgen.__file__).resolve().parents[1]
        env = {**os.environ, "MYPYPATH": os.pathsep.join((str(work), str(loadgen)))}
        files = [str(p.relative_to(work)) for p in sources(work / "interlude")]
        run = subprocess.run(
            [sys.executable, "-m", "mypyc", *files],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if run.returncode != 0:
            tail = (run.stdout + run.stderr).strip().splitlines()[-20:]
            raise BuildError("mypyc failed:\n" + "\n".join(tail))
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
        for ext in work.rglob("*.so"):
            rel = ext.relative_to(work)
            if "build" in rel.parts:
                continue  # mypyc's own intermediate copies
            dest = staging / (_SUPPORT if len(rel.parts) == 1 else _TREE) / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ext, dest)
        (staging / "complete").write_text(" ".join(files) + "\n")
        try:
            staging.rename(target)
        except OSError:  # another process finished the same build first
            shutil.rmtree(staging, ignore_errors=True)
    return target


def activate(package: str, path: MutableSequence[str]) -> bool:
    """Called first thing by `interlude.sim` and `interlude.policy`: with mode `on` and a build
    that matches the sources, put the build's copy of `package` ahead on `path` (the package's
    `__path__`), so its compiled modules load instead of the .py files. Returns whether it did."""
    global _warned
    # Every process imports these packages: the usual case costs one look-up (`Env` checks the
    # value where it matters, in `bench sim`).
    if os.environ.get(_VARIABLE) != "on":
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
    support = str(found / _SUPPORT)
    if support not in sys.path:
        sys.path.append(support)
    path.insert(0, str(found / _TREE / "interlude" / package.rpartition(".")[2]))
    return True


def is_active() -> bool:
    """Whether this process runs the compiled simulator (its engine module is an extension)."""
    from interlude.sim import engine

    return not str(engine.__file__).endswith(".py")


@contextmanager
def worker_pool(workers: int, compiled: bool) -> Iterator[ProcessPoolExecutor]:
    """Worker processes for a sweep; with `compiled`, fresh interpreters that import the build
    (forked ones would keep this process's pure-Python modules). The variable that tells them
    is set while the pool runs and restored after."""
    before = os.environ.get(_VARIABLE)
    if compiled:
        os.environ[_VARIABLE] = "on"
    context = get_context("spawn") if compiled else None
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as ex:
            yield ex
    finally:
        if before is None:
            os.environ.pop(_VARIABLE, None)
        else:
            os.environ[_VARIABLE] = before
