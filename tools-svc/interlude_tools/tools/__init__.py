"""The tools a worker runs, one kind per module, apart from the service that runs them.

A tool module holds `Tool` subclasses (`interlude_tools.registry`) and what only they use: their
config dataclasses, backends, pure rules and data (`retrieval` with `retrieval_backends`,
`textworld` with `textworld_game` and `textworld_layouts`, `http_tool` with `http_guard`,
`model_endpoints` with `simulated_models`, `mcp_bridge`). Nothing here scans for tools: the
worker's command line (`interlude_tools.cli`) fills its `Registry` from `default_registry` (the
built-ins, in `registry`), `standard.standard_tools` (the tools every worker runs), the tools
file (`interlude_tools.config`, which builds the `[[http]]`, `[models]` and `[[mcp]]` tools
from these modules) and the `interlude.tools` entry points; a new tool module is named in one
of those places.
"""
