"""The HTTP load generator: replay augmented-request workloads against OpenAI-compatible servers.

`plan` turns a workload (the InferCept trace, a generated mix, a user JSONL file) into timed
conversations; `text` writes prompts and tool answers of exact token counts; `client` runs one
conversation in one of three modes (`MODES`): against Interlude with client-side tools that
resume paused sessions, with server-side tools, or against any OpenAI-compatible server the way
users drive one today (run each tool, resubmit the whole conversation); `replay` runs a schedule
with a horizon and measures it with the simulator's metric code; `report` writes results, plots
and the side-by-side comparison. Unlike the workloads it replays (`interlude_workloads`) this
needs httpx, rich, matplotlib and (for exact token counts) transformers: import it explicitly.
"""
