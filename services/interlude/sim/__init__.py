"""The discrete-event simulator: the same policies as the engine, at GPU scale, on a CPU."""

from interlude.compiled import activate

# Before any submodule: with INTERLUDE_SIM_COMPILED=on they load from a mypyc build.
activate(__name__, __path__)

from interlude.sim.engine import SimConfig, SimulationError, Simulator
from interlude.sim.metrics import RunMetrics

__all__ = ["RunMetrics", "SimConfig", "SimulationError", "Simulator"]
