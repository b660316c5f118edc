"""The discrete-event simulator: the same policies as the engine, at GPU scale, on a CPU."""

from interlude.sim.engine import SimConfig, SimulationError, Simulator
from interlude.sim.metrics import RunMetrics

__all__ = ["RunMetrics", "SimConfig", "SimulationError", "Simulator"]
