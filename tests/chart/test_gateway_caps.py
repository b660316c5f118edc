"""The gateway's per-key caps in the chart (`gateway.auth.defaultSessions`,
`gateway.auth.defaultToolCalls`), and what stays out of a deployed tool worker: the test tools
(`--test-tools`)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from .conftest import CASES, CHART, container, run_helm


def test_the_gateway_takes_the_default_caps(render: Any) -> None:
    args = container(render(), "gateway")["args"]
    assert "--default-sessions=0" in args and "--default-tool-calls=0" in args  # no caps
    capped = render("--set", "gateway.auth.defaultSessions=4,gateway.auth.defaultToolCalls=2")
    args = container(capped, "gateway")["args"]
    assert "--default-sessions=4" in args and "--default-tool-calls=2" in args


@pytest.mark.parametrize(
    ("setting", "message"),
    [  # helm 4's wording, then helm 3's
        ("gateway.auth.defaultSessions=-1", r"defaultSessions.*minimum|defaultSessions.*greater"),
        ("gateway.auth.defaultToolCalls=many", r"defaultToolCalls.*(want integer|integer)"),
    ],
)
def test_the_schema_refuses_a_bad_cap(helm: str, setting: str, message: str) -> None:
    flag = "--set-string" if setting.endswith("many") else "--set"
    out = run_helm(helm, "template", "rel", str(CHART), flag, setting)
    assert out.returncode != 0
    assert re.search(message, out.stderr, re.DOTALL), out.stderr


@pytest.mark.parametrize("case", ["default", "production-gpu", "minimal", "everything"])
def test_deployed_tool_workers_publish_no_test_tools(render: Any, case: str) -> None:
    assert "--test-tools" not in container(render(*CASES[case]), "tools")["args"]
