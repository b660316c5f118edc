"""VllmEngine: one vLLM AsyncLLM (with our scheduler unless `policy=None`) and its counters.

The engine service's sessions (`sessions.py`, `chat.py`) run on `llm`; benchmarks run scripted
sessions through the same `ChatRunner` on a subclass (`interlude.bench.scripted_engine`).
"""

from __future__ import annotations

from typing import Any

from interlude.engine.config import EngineConfig, prepare_process_env


class VllmEngine:
    """One AsyncLLM built from `config`, with Interlude's stat logger.

    Side effects: prepares the process environment (`prepare_process_env`) and starts vLLM's
    engine core. `stats` and `turn_start` read what the logger saw at the last step.
    """

    def __init__(self, config: EngineConfig) -> None:
        prepare_process_env()
        from vllm.v1.engine.async_llm import AsyncLLM

        self.config = config
        from interlude.engine.metrics import InterludeStatLogger

        self._stats: InterludeStatLogger | None = None

        def factory(vllm_config: Any, engine_index: int = 0) -> InterludeStatLogger:
            self._stats = InterludeStatLogger(vllm_config, engine_index)
            return self._stats

        self.llm = AsyncLLM.from_engine_args(config.engine_args(), stat_loggers=[factory])

    def stats(self) -> dict[str, Any]:
        """Latest scheduler counters plus prefix-cache totals (refreshed every engine step)."""
        return self._stats.snapshot() if self._stats else {}

    def mirror_metrics(self) -> None:
        """Bring the `interlude:*` scheduler metrics up to date (before `/metrics` is written)."""
        if self._stats is not None:
            self._stats.mirror()

    def turn_start(self, request_id: str) -> tuple[str, float] | None:
        """How `request_id`'s latest resumed turn got its KV back, and its wait (once)."""
        return self._stats.take_turn_start(request_id) if self._stats else None

    def shutdown(self) -> None:
        self.mirror_metrics()  # what it counted since the last read of /metrics
        self.llm.shutdown()
        # AsyncLLM.__del__ shuts down again; run at interpreter exit, after module globals are
        # gone, that prints a TypeError traceback. Once is enough.
        setattr(self.llm, "shutdown", lambda timeout=None: None)  # noqa: B010
