"""The simulator's run settings and the error it raises when the engine it simulates is stuck."""

from __future__ import annotations

from dataclasses import dataclass

from mypy_extensions import mypyc_attr


# An exception stays a Python class: mypyc cannot compile subclasses of builtin ones.
@mypyc_attr(native_class=False)
class SimulationError(RuntimeError):
    """The simulated engine can make no progress (a deadlock) or was misconfigured."""


@dataclass(frozen=True)
class SimConfig:
    # Stop at this simulated time; requests still open count as unfinished. None: run to the end.
    horizon_s: float | None = None
    # Verify block and token conservation after every step (tests; slows the run down).
    check_integrity: bool = False
    # Most identical decode iterations one step may cover; 1 simulates every iteration.
    max_jump: int = 1_000_000
    # Tokens a chat template adds with every tool answer (the call's markup, the answer's
    # markers): prefilled with the answer, but not output (`bench sim-check --markup`).
    answer_markup_tokens: int = 0

    def __post_init__(self) -> None:
        if self.answer_markup_tokens < 0:
            raise ValueError("SimConfig.answer_markup_tokens must be >= 0")
        if self.horizon_s is not None and self.horizon_s <= 0:
            raise ValueError("SimConfig.horizon_s must be > 0")
        if self.max_jump < 1:
            raise ValueError("SimConfig.max_jump must be >= 1")
