"""What runs inside vLLM's engine core: our scheduler and what it alone uses.

The scheduler (a vLLM `Scheduler` subclass) asks the policy, keeps the policy queue, parks paused
sessions, shows the policy its views, and moves KV through the host swap connector and its block
copier. Nothing here speaks HTTP or knows about chat sessions; vLLM loads these modules by path
(`EngineConfig` names them), in the engine-core process.
"""
