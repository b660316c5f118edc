"""`--calls model` without a server: the requests it sends and the targets it refuses."""

from __future__ import annotations

import pytest

from interlude.loadgen.client import Target
from interlude.loadgen.model_calls import CALL_TOKENS, request_body
from interlude.loadgen.plan import Conversation, Step

CONV = Conversation("c", "qa", 0.0, 20, (Step(6, "qa", 0.2, 9), Step(4, "math", 0.1, 5), Step(3)))


def test_calls_before_the_last_take_the_runs_tool_choice_and_the_last_none() -> None:
    target = Target("http://x/v1", "m", "resubmit", calls="model", tool_choice="required")
    bodies = [request_body(target, CONV, [], i) for i in range(3)]
    assert [b["tool_choice"] for b in bodies] == ["required", "required", "none"]
    assert [b["max_tokens"] for b in bodies] == [6 + CALL_TOKENS, 4 + CALL_TOKENS, 3 + CALL_TOKENS]
    names = {t["function"]["name"] for t in bodies[0]["tools"]}
    assert names == {"qa", "math"}
    # The model decides: no script, no forced length; a plain server gets no Interlude field.
    assert not any(k in b for b in bodies for k in ("ignore_eos", "interlude_script"))
    assert "interlude_kind" not in bodies[0]


def test_a_named_choice_names_the_traces_next_tool() -> None:
    target = Target("http://x/v1", "m", "resubmit", calls="model", tool_choice="named")
    choices = [request_body(target, CONV, [], i)["tool_choice"] for i in range(3)]
    named = [{"type": "function", "function": {"name": n}} for n in ("qa", "math")]
    assert choices == [*named, "none"]


def test_resume_mode_names_the_kind() -> None:
    target = Target("http://x/v1", "m", "resume", calls="model")
    body = request_body(target, CONV, [], 0)
    assert body["interlude_kind"] == "qa" and body["tool_choice"] == "auto"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "server-tools", "calls": "model"}, "not server-tools"),
        ({"mode": "resume", "calls": "models"}, "calls must be one of"),
        ({"mode": "resume", "calls": "model", "tool_choice": "none"}, "tool_choice must be"),
    ],
)
def test_bad_targets_are_refused(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Target("http://x/v1", "m", **kwargs)
