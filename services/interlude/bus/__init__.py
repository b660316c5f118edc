"""The tool bus: engines and tool workers talk over Redis Streams (DESIGN sections 1 and 6).

The wire format is `interlude.api.bus`, defined once for both sides; `client` is the engine's
side and `registry` the published-tools hash. The worker's side is `interlude_tools`
(tools-svc/).
"""

from interlude.bus.client import Delivery, EngineBus

__all__ = ["Delivery", "EngineBus"]
