"""The gateway: Interlude's OpenAI-compatible front door (`interlude gateway`).

`app.py` routes, `service.py` the chat-completion logic
(new session, resume of a paused one, or fallback to recompute), `pool.py` the engines and how a
new session picks one, `sessions.py` where paused sessions are remembered, `upstream.py` the
engine's internal API, `auth.py` and `ratelimit.py` the protection, `metrics.py` what is counted.
The request models and the engine's events come from the contract package, `interlude.api`.
"""
