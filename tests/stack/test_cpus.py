"""Engines that share one machine get cores of their own (`interlude.stack.cpus`).

The split itself is pure; `interlude up` hands each engine its list as vLLM's
`VLLM_CPU_OMP_THREADS_BIND`, and the tests' two-engine stack (tests/gateway/conftest.py) does
the same, so its engines log the cores planned for them (checked there, on the real engines).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from interlude.cli import app
from interlude.stack.cpus import (
    AUTO,
    check_binds,
    engine_binds,
    group_siblings,
    id_list,
    parse_id_list,
    shared_cores,
)
from interlude.stack.specs import part_specs
from interlude.stack.up import StackConfig

BIND = "VLLM_CPU_OMP_THREADS_BIND"


def alone(*cpus: int) -> list[tuple[int, ...]]:
    return [(c,) for c in cpus]


@pytest.mark.parametrize(
    ("engines", "cores", "want"),
    [
        (1, alone(0, 1), [AUTO]),  # one engine: vLLM's own choice, as before
        (2, alone(0, 1), ["0", "1"]),  # the CI machine: a core each
        (2, alone(*range(16)), ["0-7", "8-15"]),
        (3, alone(*range(16)), ["0-4", "5-9", "10-14"]),  # core 15 left to the front ends
        (2, alone(1, 3, 5, 7), ["1,3", "5,7"]),  # an affinity mask with holes
        # Hyperthreads numbered (0, 4), (1, 5), ...: whole physical cores per engine, one
        # logical CPU each, as vLLM's auto binds on x86.
        (2, [(0, 4), (1, 5), (2, 6), (3, 7)], ["0-1", "2-3"]),
        (3, alone(0, 1), ["0", "1", "0"]),  # more engines than cores: shared, round robin
    ],
)
def test_each_engine_gets_its_own_cores_while_there_are_enough(
    engines: int, cores: list[tuple[int, ...]], want: list[str]
) -> None:
    binds = engine_binds(engines, cores)
    assert binds == want
    assert shared_cores(binds) == ([0] if engines > len(cores) else [])


def test_siblings_group_into_physical_cores_within_the_affinity_mask() -> None:
    topology = {0: "0,4", 4: "0,4", 1: "1,5", 5: "1,5", 2: "2-3", 3: "2-3"}
    assert group_siblings([0, 1, 4, 5], topology.get) == [(0, 4), (1, 5)]
    # A sibling outside the mask is not ours to bind; no topology: each CPU alone.
    assert group_siblings([0, 1], topology.get) == [(0,), (1,)]
    assert group_siblings([7, 8], lambda cpu: None) == [(7,), (8,)]
    assert group_siblings([2, 3], topology.get) == [(2, 3)]


def test_core_lists_read_back_as_vllm_writes_them() -> None:
    for cpus in ([0], [0, 1, 2, 5], [1, 3, 4, 5, 9]):
        assert parse_id_list(id_list(cpus)) == cpus
    assert id_list([0, 1, 2, 5]) == "0-2,5"
    assert parse_id_list(" 4-6, 0") == [4, 5, 6, 0]
    for bad in ("", "a", "3-", "5-2", "1;2"):
        with pytest.raises(ValueError):
            parse_id_list(bad)
    with pytest.raises(ValueError, match="no cores"):
        engine_binds(2, [])


def test_binds_asked_for_are_checked_when_the_stack_is_configured(tmp_path: Path) -> None:
    check_binds(["0-3", AUTO], 2)
    with pytest.raises(ValueError, match="one core list per engine"):
        StackConfig(tmp_path, engines=2, engine_cpus=("0",))
    with pytest.raises(ValueError, match="not a core list"):
        StackConfig(tmp_path, engines=2, engine_cpus=("0", "x"))
    result = CliRunner().invoke(app, ["up", "--engines", "2", "--engine-cpus", "0|1|2"])
    assert result.exit_code == 2 and "one core list per engine" in result.output


def test_the_stack_binds_each_engine_to_its_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def binds(cfg: StackConfig) -> list[str | None]:
        specs = part_specs(cfg, "redis://h:1", list(range(8101, 8101 + cfg.engines)), None)
        return [s.env.get(BIND) for s in specs if s.name.startswith("engine-")]

    monkeypatch.setattr("interlude.stack.specs.available_cores", lambda: alone(0, 1))
    assert binds(StackConfig(tmp_path, engines=2)) == ["0", "1"]
    # One engine keeps whatever vLLM (or the caller's environment) chooses.
    assert binds(StackConfig(tmp_path)) == [None]
    asked = StackConfig(tmp_path, engines=2, engine_cpus=("1", "0"))
    assert binds(asked) == ["1", "0"]
    # The other parts float: only engines are bound.
    specs = part_specs(StackConfig(tmp_path, engines=2), "redis://h:1", [8101, 8102], None)
    assert all(BIND not in s.env for s in specs if not s.name.startswith("engine-"))
