"""OpenAI chat completions served by the engine itself, in the process that runs vLLM.

`routes` is ``POST /v1/chat/completions``; `service` decides whether a request resumes a
session paused here or starts one; `leg` folds a session's events into the answer; `render`
writes OpenAI's JSON and SSE; `conversation` keys conversations; `store` remembers sessions
paused for their client, per tenant; `stops` applies stop strings. The gateway in front only
authenticates, limits and routes; it relays these bytes without reading them.
"""
