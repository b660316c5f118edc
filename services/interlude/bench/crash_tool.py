"""A tool that kills the worker running it: the poison call of the tool-bus fault drill.

Never in a worker's registry by default: the drill makes it an `interlude.tools` entry point of
a throwaway distribution on the drill's workers' PYTHONPATH only (`toolbus_faults`).
"""

from __future__ import annotations

import os
import signal
from typing import Any

from interlude_tools.registry import Tool


class Crash(Tool):
    name = "crash"
    description = "kill the worker that runs this call (fault drills only)"

    async def run(self, arguments: dict[str, Any]) -> str:
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("SIGKILL returned")  # never reached: the process is gone


ENTRY_POINT = "crash = interlude.bench.crash_tool:Crash"
