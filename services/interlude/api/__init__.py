"""The contracts that cross a process boundary, in one place: what the gateway, the engines,
the tool workers and clients say to each other.

* `openai`: the OpenAI chat-completions request we accept (pydantic) and its extensions;
  `messages`: the message and tool shapes, checked whole; `script`: scripted interception.
* `engine`: the bodies of the engine's internal HTTP API; `events`: what a leg streams back.
* `wire`: SSE framing and OpenAI's error envelope; `names`: tool names, session and call ids.
* `bus`: the tool bus's Redis Streams messages; `tools`: the published-tools hash;
  `redis_url`: the Redis URLs every component takes, Sentinel's included.
* `cluster`: the pod label the operator drains engines by, and the engine metrics it reads.

Rule (kept by tests/test_layering.py): modules here import the standard library, pydantic and
each other, nothing else: no vLLM, torch, web framework, HTTP client or Redis client. So any
process can take its contracts from here without the others' dependencies.
"""
