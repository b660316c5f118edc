"""The engine service: HTTP, chat sessions, tool calls and events around one vLLM engine.

The scheduler it configures vLLM with lives in `interlude.enginecore`; model profiling lives in
`interlude.profiling`.
"""
