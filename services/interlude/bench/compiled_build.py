"""`interlude bench compile`: build the simulator and the policies with mypyc, and run a sweep's
workers on that build.

What a build is keyed by, where it lives and who imports it is `interlude.compiled`'s (the hook
`interlude.policy` and `interlude.sim` call at import); this module is the tool side, kept out
of that hook because it runs compilers, copies trees and starts processes, and it reads the
workloads package to type-check the simulator against.

Side effects: `build` runs mypyc and a C compiler in a temporary copy of the package and writes
only under the cache directory (`INTERLUDE_COMPILED_DIR`, default `~/.cache/interlude/compiled`);
`worker_pool` sets `INTERLUDE_SIM_COMPILED` while its pool runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from multiprocessing import get_context
from pathlib import Path

from interlude.compiled import MODULES, PACKAGE_ROOT, SUPPORT, TREE, VARIABLE, build_dir, target_dir


class BuildError(RuntimeError):
    """mypyc or the C compiler failed; the message holds the end of their output."""


def sources(root: Path = PACKAGE_ROOT) -> list[Path]:
    """The .py files a build compiles (`MODULES`), under the package folder `root`."""
    return [root / pkg / f"{name}.py" for pkg, names in MODULES.items() for name in names]


def build() -> Path:
    """Compile `MODULES` unless a matching build exists; return the build's directory.

    mypyc writes next to the sources it compiles, so it runs in a copy of the package; the
    extensions then move to the cache. Takes about 40 CPU-seconds.
    """
    found = build_dir()
    if found is not None:
        return found
    target = target_dir()
    with tempfile.TemporaryDirectory(prefix="interlude-mypyc-") as tmp:
        work = Path(tmp)
        ignore = shutil.ignore_patterns("__pycache__", "*.so", ".mypy_cache")
        shutil.copytree(PACKAGE_ROOT, work / "interlude", ignore=ignore)
        import interlude_workloads

        workloads = Path(interlude_workloads.__file__).resolve().parents[1]
        env = {**os.environ, "MYPYPATH": os.pathsep.join((str(work), str(workloads)))}
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
            dest = staging / (SUPPORT if len(rel.parts) == 1 else TREE) / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ext, dest)
        (staging / "complete").write_text(" ".join(files) + "\n")
        try:
            staging.rename(target)
        except OSError:  # another process finished the same build first
            shutil.rmtree(staging, ignore_errors=True)
    return target


def is_active() -> bool:
    """Whether this process runs the compiled simulator (its module is an extension)."""
    from interlude.sim import simulator

    return not str(simulator.__file__).endswith(".py")


@contextmanager
def worker_pool(workers: int, compiled: bool) -> Iterator[ProcessPoolExecutor]:
    """Worker processes for a sweep; with `compiled`, fresh interpreters that import the build
    (forked ones would keep this process's pure-Python modules). The variable that tells them
    is set while the pool runs and restored after."""
    before = os.environ.get(VARIABLE)
    if compiled:
        os.environ[VARIABLE] = "on"
    context = get_context("spawn") if compiled else None
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as ex:
            yield ex
    finally:
        if before is None:
            os.environ.pop(VARIABLE, None)
        else:
            os.environ[VARIABLE] = before
