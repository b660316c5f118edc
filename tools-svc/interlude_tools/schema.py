"""Tool arguments checked against the tool's JSON schema before the tool runs.

A tool publishes its schema with its name (`interlude.bus.published`), and models fill calls in
from it; a call whose arguments do not fit is answered "bad_arguments" with what did not fit,
without running the tool. Schemas are JSON Schema 2020-12 (what OpenAI-style tool definitions
use); one that is not valid is refused when its tool is registered, not at the first call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import jsonschema
from jsonschema.exceptions import best_match
from jsonschema.protocols import Validator


def check_schema(name: str, schema: Mapping[str, Any]) -> None:
    """ValueError naming the tool if `schema` is not a valid JSON schema."""
    try:
        jsonschema.Draft202012Validator.check_schema(dict(schema))
    except jsonschema.SchemaError as exc:
        raise ValueError(f"tool {name!r} has an invalid argument schema: {exc.message}") from None


def argument_error(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
    """What in `arguments` does not fit `schema` (the most relevant error), or None."""
    validator = _validator(_frozen(schema))
    if validator.is_valid(arguments):  # the common case, without collecting errors
        return None
    error = best_match(validator.iter_errors(dict(arguments)))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{error.message} (at {where!r})" if where else error.message


@lru_cache(maxsize=256)
def _validator(key: str) -> Validator:
    return jsonschema.Draft202012Validator(json.loads(key))


def _frozen(schema: Mapping[str, Any]) -> str:
    """A hashable key for a schema (its canonical JSON)."""
    return json.dumps(schema, sort_keys=True)
