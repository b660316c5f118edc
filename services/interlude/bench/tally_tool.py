"""A server-side tool with a side effect the chaos drill can count (`bench chaos`).

`tally` takes `scripted`'s arguments (sleep `delay_s`, answer `tokens` words) and, for the call
it runs, appends the call id to `<drill dir>/runs.log` when it starts and creates
`<drill dir>/effects/<call id>` when it is done: the effect, made idempotent per call id as
`Tool` asks of a tool with outside effects (a call reclaimed from a killed worker runs again,
and must not act twice). The drill counts both: runs per call may exceed one, effects may not.

Never in a worker's registry by default: the drill makes it an `interlude.tools` entry point of
a throwaway distribution on its stack's PYTHONPATH (`chaos`), and gives the directory in
INTERLUDE_DRILL_DIR.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Any, ClassVar

from interlude.env import load_env
from interlude_tools.context import current_call
from interlude_tools.registry import Tool, ToolArgumentError

RUNS = "runs.log"
EFFECTS = "effects"


def effect_name(call_id: str) -> str:
    """The effect's file name: the call id, with anything but [A-Za-z0-9_.-] replaced."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", call_id)


class Tally(Tool):
    name = "tally"
    description = "sleep delay_s, record this call's effect once, return tokens words"
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"delay_s": {"type": "number"}, "tokens": {"type": "integer"}},
    }

    async def run(self, arguments: dict[str, Any]) -> str:
        delay, tokens = arguments.get("delay_s", 0.0), arguments.get("tokens", 1)
        if not isinstance(delay, int | float) or not isinstance(tokens, int) or tokens < 1:
            raise ToolArgumentError("tally takes delay_s (a number) and tokens (an int >= 1)")
        root = Path(load_env().drill_dir or ".")
        call = current_call().call_id
        with (root / RUNS).open("a") as log:  # one short line per write: appends never mix
            log.write(call + "\n")
        await asyncio.sleep(float(delay))
        try:
            fd = os.open(root / EFFECTS / effect_name(call), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.close(fd)
        except FileExistsError:
            pass  # an earlier run of this call acted already
        return " ".join(["word"] * tokens)


ENTRY_POINT = "tally = interlude.bench.tally_tool:Tally"
