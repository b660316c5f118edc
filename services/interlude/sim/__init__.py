"""The discrete-event simulator: the same policies as the engine, at GPU scale, on a CPU."""

from interlude.compiled import activate

# Before any submodule: with INTERLUDE_SIM_COMPILED=on they load from a mypyc build.
activate(__name__, __path__)

from interlude.sim.config import SimConfig, SimulationError
from interlude.sim.metrics import RunMetrics
from interlude.sim.simulator import Simulator

__all__ = ["RunMetrics", "SimConfig", "SimulationError", "Simulator"]
