"""Tool and answer schemas are checked against JSON Schema's metaschema once per distinct
schema (agents send the same tools every turn), and a bad one is refused every time, naming
the field it came in."""

from __future__ import annotations

import pytest

from interlude.api.openai import Unsupported
from interlude.engine.completions import service

GOOD = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
BAD = {"type": "objekt"}


def test_a_valid_schema_is_checked_once() -> None:
    service._schema_problem.cache_clear()
    service._check_schema(GOOD, "tools[0].function.parameters")
    # The same schema, its keys in another order, in another request's field.
    service._check_schema(dict(reversed(GOOD.items())), "tools[1].function.parameters")
    info = service._schema_problem.cache_info()
    assert (info.misses, info.hits) == (1, 1)


def test_a_bad_schema_is_refused_every_time_naming_its_field() -> None:
    for where in ("tools[0].function.parameters", "response_format.json_schema.schema"):
        with pytest.raises(Unsupported) as refused:
            service._check_schema(BAD, where)
        assert refused.value.param == where
        assert str(refused.value).startswith(f"{where} is not a valid JSON Schema: ")
        assert "objekt" in str(refused.value)
