"""The tool bus: engines and tool workers talk over Redis Streams (DESIGN sections 1 and 6).

Both halves of the protocol live here, over one wire format (`interlude.api.bus`):
`engine_side` (submit calls, take each result once), `worker_side` (read calls, take over a
dead worker's, post results; with `heartbeat` and `dead_letter`), and the helpers both use
(`streams`). `published` is the published-tools hash, `acl` the Redis users each side needs,
`sentinel` a client that follows a failover. What a worker decides and runs is
`interlude_tools` (tools-svc/).
"""

from interlude.bus.engine_side import Delivery, EngineBus
from interlude.bus.worker_side import WorkerBus

__all__ = ["Delivery", "EngineBus", "WorkerBus"]
